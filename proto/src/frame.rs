//! gRPC's length-prefixed messages.
//!
//! On the wire every message of a call is one byte saying whether it is
//! compressed, its length as a big-endian `u32`, then the message itself.
//! tonic frames and unframes inside its codec; the paths that go around
//! tonic for speed do it with this module, so the layout is written once:
//! nereid-server's `ModelInfer`, nereid-gateway's routing and local answers,
//! and nereid-perf's unary calls.
//!
//! What a malformed prefix means (which status, which words) is the
//! caller's to say: the server answers in tonic's terms, the gateway and
//! the load generator in their own.

use bytes::{BufMut, Bytes, BytesMut};

/// The bytes in front of every message: the compressed flag and the length.
pub const PREFIX_LEN: usize = 5;

/// A message's prefix, as the sender wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefix {
    /// 0 for a plain message, 1 for one compressed with the call's
    /// `grpc-encoding`; any other value is a protocol error.
    pub flag: u8,
    /// The length the sender declared. Not yet checked against anything:
    /// bound it before reserving memory for it.
    pub length: usize,
}

impl Prefix {
    /// The prefix at the start of `bytes`, or `None` while fewer than
    /// [`PREFIX_LEN`] bytes have come.
    pub fn read(bytes: &[u8]) -> Option<Prefix> {
        let [flag, a, b, c, d] = *bytes.first_chunk::<PREFIX_LEN>()?;
        Some(Prefix {
            flag,
            length: u32::from_be_bytes([a, b, c, d]) as usize,
        })
    }
}

/// Why a message could not be framed.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The message is longer than the caller allows.
    #[error("a gRPC message of {length} bytes is over the limit of {limit} bytes")]
    OverLimit { length: usize, limit: usize },
    /// The message is longer than a `u32` length can say.
    #[error("a gRPC message of {0} bytes is longer than 4 GiB, the most its prefix can say")]
    TooLarge(usize),
    /// prost could not encode the message.
    #[error("the gRPC message could not be encoded: {0}")]
    Encode(prost::EncodeError),
}

/// `message`, already encoded, framed uncompressed in one new buffer.
pub fn frame(message: &[u8]) -> Result<Bytes, FrameError> {
    let mut framed = with_prefix(message.len())?;
    framed.put_slice(message);
    Ok(framed.freeze())
}

/// `message` encoded and framed uncompressed, in one buffer allocated
/// once at its final size.
pub fn encode(message: &impl prost::Message) -> Result<Bytes, FrameError> {
    encode_within(message, usize::MAX)
}

/// Like [`encode`], for a message that may be at most `limit` bytes long,
/// which is checked before anything is allocated or encoded.
pub fn encode_within(message: &impl prost::Message, limit: usize) -> Result<Bytes, FrameError> {
    let length = message.encoded_len();
    if length > limit {
        return Err(FrameError::OverLimit { length, limit });
    }
    let mut framed = with_prefix(length)?;
    message.encode(&mut framed).map_err(FrameError::Encode)?;
    Ok(framed.freeze())
}

/// A buffer for a message of `length` bytes, holding its prefix.
fn with_prefix(length: usize) -> Result<BytesMut, FrameError> {
    let declared = u32::try_from(length).map_err(|_| FrameError::TooLarge(length))?;
    let mut buffer = BytesMut::with_capacity(PREFIX_LEN + length);
    buffer.put_u8(0);
    buffer.put_u32(declared);
    Ok(buffer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_framed_message_reads_back() {
        let framed = frame(b"hello").unwrap();
        assert_eq!(&framed[..], b"\0\0\0\0\x05hello");
        assert_eq!(Prefix::read(&framed), Some(Prefix { flag: 0, length: 5 }));
    }

    #[test]
    fn a_prefix_needs_five_bytes() {
        assert_eq!(Prefix::read(b"\x01\0\0\x01"), None);
        assert_eq!(Prefix::read(b"\x01\0\0\x01\0"), Some(Prefix { flag: 1, length: 256 }));
        assert_eq!(
            Prefix::read(b"\x07\xff\xff\xff\xffmore"),
            Some(Prefix {
                flag: 7,
                length: u32::MAX as usize
            })
        );
    }

    #[test]
    fn an_encoded_message_is_its_prost_encoding_behind_the_prefix() {
        let request = crate::inference::ModelReadyRequest {
            name: "resnet".into(),
            version: "2".into(),
        };
        let framed = encode(&request).unwrap();
        let prefix = Prefix::read(&framed).unwrap();
        assert_eq!(prefix.flag, 0);
        assert_eq!(prefix.length, framed.len() - PREFIX_LEN);
        assert_eq!(
            &framed[PREFIX_LEN..],
            prost::Message::encode_to_vec(&request).as_slice()
        );
    }

    #[test]
    fn a_message_over_the_limit_is_refused() {
        let request = crate::inference::ModelReadyRequest {
            name: "resnet".into(),
            version: String::new(),
        };
        let length = prost::Message::encoded_len(&request);
        assert_eq!(encode_within(&request, length).unwrap().len(), PREFIX_LEN + length);
        assert!(matches!(
            encode_within(&request, length - 1),
            Err(FrameError::OverLimit { length: l, limit }) if l == length && limit == length - 1
        ));
    }

    #[test]
    fn a_length_past_u32_is_refused_before_any_allocation() {
        assert!(matches!(with_prefix(1 << 32), Err(FrameError::TooLarge(n)) if n == 1 << 32));
    }
}
