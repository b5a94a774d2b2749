//! Validated names: [`SinkName`] and [`IndexName`].

use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;

/// The longest name accepted, in bytes (PostgreSQL's identifier limit, `NAMEDATALEN - 1`).
pub const MAX_NAME_LEN: usize = 63;

/// Why a name was refused. Names match `^[a-z_][a-z0-9_]*$` and are at most [`MAX_NAME_LEN`] bytes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The name is empty.
    #[error("name is empty (expected ^[a-z_][a-z0-9_]*$)")]
    Empty,
    /// The name is longer than [`MAX_NAME_LEN`] bytes; holds the name.
    #[error("name {0:?} is {len} bytes, longer than {MAX_NAME_LEN}", len = .0.len())]
    TooLong(String),
    /// The name has a character outside `[a-z0-9_]` or starts with a digit; holds the name.
    #[error("name {0:?} does not match ^[a-z_][a-z0-9_]*$")]
    Invalid(String),
}

fn validate(name: &str) -> Result<(), NameError> {
    let bytes = name.as_bytes();
    match bytes.first() {
        None => return Err(NameError::Empty),
        Some(_) if bytes.len() > MAX_NAME_LEN => return Err(NameError::TooLong(name.to_owned())),
        Some(b'0'..=b'9') => return Err(NameError::Invalid(name.to_owned())),
        Some(_) => {}
    }
    if bytes.iter().all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') {
        Ok(())
    } else {
        Err(NameError::Invalid(name.to_owned()))
    }
}

macro_rules! validated_name {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        ///
        /// Cloning moves a reference count: every envelope of an index shares one allocation.
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize), serde(transparent))]
        pub struct $name(Arc<str>);

        impl $name {
            /// Validates `name` against `^[a-z_][a-z0-9_]*$` and the 63-byte limit.
            ///
            /// # Errors
            /// [`NameError`] naming what is wrong; nothing is allocated for an empty name.
            pub fn new(name: impl Into<String>) -> Result<Self, NameError> {
                let name = name.into();
                validate(&name)?;
                Ok(Self(name.into()))
            }

            /// The name as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<&str> for $name {
            type Error = NameError;
            fn try_from(name: &str) -> Result<Self, NameError> {
                Self::new(name)
            }
        }

        impl TryFrom<String> for $name {
            type Error = NameError;
            fn try_from(name: String) -> Result<Self, NameError> {
                Self::new(name)
            }
        }

        impl std::str::FromStr for $name {
            type Err = NameError;
            fn from_str(name: &str) -> Result<Self, NameError> {
                Self::new(name)
            }
        }

        #[cfg(feature = "serde")]
        impl<'de> serde::Deserialize<'de> for $name {
            /// Deserialization validates too: an invalid name is a deserialization error.
            fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
                let name = <String as serde::Deserialize>::deserialize(de)?;
                Self::new(name).map_err(serde::de::Error::custom)
            }
        }
    };
}

validated_name!(
    /// The name of a sink (and so of its lane): `^[a-z_][a-z0-9_]*$`, at most 63 bytes.
    ///
    /// ```
    /// use lanestream::SinkName;
    /// assert_eq!(SinkName::new("search").unwrap().as_str(), "search");
    /// assert!(SinkName::new("Search").is_err());
    /// ```
    SinkName
);

validated_name!(
    /// The name of an index (for PostgreSQL input, `schema_table`): `^[a-z_][a-z0-9_]*$`, at most
    /// 63 bytes.
    ///
    /// ```
    /// use lanestream::IndexName;
    /// assert!(IndexName::new("public_orders").is_ok());
    /// assert!(IndexName::new("9lives").is_err());
    /// ```
    IndexName
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_pattern_and_length_limit() {
        for ok in ["a", "_", "search", "public_orders_2", &"x".repeat(63)] {
            assert!(SinkName::new(ok).is_ok(), "{ok:?} refused");
        }
        assert_eq!(SinkName::new(""), Err(NameError::Empty));
        assert!(matches!(SinkName::new("x".repeat(64)), Err(NameError::TooLong(_))));
        for bad in ["A", "1a", "a-b", "a b", "é", "a.b", "a\0"] {
            assert!(matches!(IndexName::new(bad), Err(NameError::Invalid(_))), "{bad:?} accepted");
        }
    }

    #[test]
    fn deserialization_validates() {
        assert!(serde_json::from_str::<SinkName>("\"ok_name\"").is_ok());
        assert!(serde_json::from_str::<SinkName>("\"Not OK\"").is_err());
    }
}
