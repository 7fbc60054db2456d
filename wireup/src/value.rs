//! Values stored with `put` and the scope that says who may see them.

use serde::{Deserialize, Serialize};

/// Who may see a key that a process puts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Scope {
    /// Only processes on the same node (e.g. a shared-memory card).
    Local,
    /// Only processes on other nodes (e.g. a network card).
    Remote,
    /// Every process of the job.
    Global,
}

impl Scope {
    /// True if a process on the owner's node may see the key.
    pub fn visible_on_node(self) -> bool {
        matches!(self, Scope::Local | Scope::Global)
    }
    /// True if a process on another node may see the key.
    pub fn visible_off_node(self) -> bool {
        matches!(self, Scope::Remote | Scope::Global)
    }
}

/// A value published with `put`: bytes or a typed scalar/string.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Value {
    /// An opaque byte blob (a business card). Encoded as one byte string, so decoding a
    /// card is a memcpy, not a per-byte loop.
    Bytes(#[serde(with = "serde_bytes")] Vec<u8>),
    /// A UTF-8 string.
    Str(String),
    /// An unsigned 64-bit integer.
    U64(u64),
    /// A signed 64-bit integer.
    I64(i64),
    /// A 64-bit float.
    F64(f64),
    /// A boolean.
    Bool(bool),
}

impl Value {
    /// The bytes of a `Bytes` value (or of a string), else `None`.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Bytes(b) => Some(b),
            Value::Str(s) => Some(s.as_bytes()),
            _ => None,
        }
    }
    /// The string of a `Str` value, else `None`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
    /// The integer of a `U64` value (or a non-negative `I64`), else `None`.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U64(v) => Some(v),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
    /// The integer of an `I64` value (or a `U64` that fits), else `None`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I64(v) => Some(v),
            Value::U64(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }
    /// Consumes the value and returns its bytes if it is `Bytes` or `Str`.
    pub fn into_bytes(self) -> Option<Vec<u8>> {
        match self {
            Value::Bytes(b) => Some(b),
            Value::Str(s) => Some(s.into_bytes()),
            _ => None,
        }
    }
}

impl From<Vec<u8>> for Value {
    fn from(v: Vec<u8>) -> Self {
        Value::Bytes(v)
    }
}
impl From<&[u8]> for Value {
    fn from(v: &[u8]) -> Self {
        Value::Bytes(v.to_vec())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Str(v)
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Str(v.to_owned())
    }
}
impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Value::U64(v)
    }
}
impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Value::U64(v.into())
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::I64(v)
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::F64(v)
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn scopes_decide_visibility() {
        assert!(Scope::Local.visible_on_node() && !Scope::Local.visible_off_node());
        assert!(!Scope::Remote.visible_on_node() && Scope::Remote.visible_off_node());
        assert!(Scope::Global.visible_on_node() && Scope::Global.visible_off_node());
    }

    proptest! {
        #[test]
        fn values_round_trip_through_postcard(b in proptest::collection::vec(any::<u8>(), 0..300), s in ".*", u in any::<u64>(), i in any::<i64>()) {
            for v in [Value::Bytes(b.clone()), Value::Str(s.clone()), Value::U64(u), Value::I64(i), Value::Bool(u % 2 == 0)] {
                let enc = postcard::to_stdvec(&v).unwrap();
                let dec: Value = postcard::from_bytes(&enc).unwrap();
                prop_assert_eq!(dec, v);
            }
        }
    }
}
