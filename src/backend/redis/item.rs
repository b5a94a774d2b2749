//! [`RedisItem`]: what the Redis backend's lanes carry, and how it travels (the codec's wire
//! form, validated on decode).

use crate::codec::{AlignedVec, CodecError};
use crate::item::{Item, LaneItem, Request};

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::item::LaneItem {}
    impl Sealed for crate::item::Request {}
}

/// What the Redis backend's lanes carry: [`LaneItem`] and [`Request`], in the codec's wire
/// form. Sealed.
pub trait RedisItem: Item + Send + Sync + Sized + 'static + sealed::Sealed {
    /// The item's bytes.
    #[doc(hidden)]
    fn encode(&self) -> Result<AlignedVec, CodecError>;
    /// The item back from its bytes, validated.
    #[doc(hidden)]
    fn decode(bytes: &[u8]) -> Result<Self, CodecError>;
}

/// Copies `bytes` into an aligned buffer (the codec reads archives in place).
fn aligned(bytes: &[u8]) -> AlignedVec {
    let mut buf = AlignedVec::with_capacity(bytes.len());
    buf.extend_from_slice(bytes);
    buf
}

impl RedisItem for LaneItem {
    fn encode(&self) -> Result<AlignedVec, CodecError> {
        crate::codec::encode_item(self)
    }

    fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        crate::codec::decode_item(&aligned(bytes))
    }
}

impl RedisItem for Request {
    fn encode(&self) -> Result<AlignedVec, CodecError> {
        crate::codec::encode_request(self)
    }

    fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        crate::codec::decode_request(&aligned(bytes))
    }
}
