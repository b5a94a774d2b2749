//! Unit tests of the log that need its insides (fault injection).
