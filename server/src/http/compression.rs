//! `Content-Encoding` on requests and `Accept-Encoding` on responses
//! (gzip and deflate, as Triton and tritonclient use them).

use std::io::{Read, Write};

use bytes::Bytes;
use flate2::Compression;
use flate2::read::{GzDecoder, ZlibDecoder};
use flate2::write::{GzEncoder, ZlibEncoder};

use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Gzip,
    Deflate,
}

impl Encoding {
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Gzip => "gzip",
            Encoding::Deflate => "deflate",
        }
    }
}

/// Parses a request's `Content-Encoding`; `None` for identity.
pub fn content_encoding(header: Option<&str>) -> Result<Option<Encoding>> {
    match header.map(str::trim) {
        None | Some("") | Some("identity") => Ok(None),
        Some(v) if v.eq_ignore_ascii_case("gzip") => Ok(Some(Encoding::Gzip)),
        Some(v) if v.eq_ignore_ascii_case("deflate") => Ok(Some(Encoding::Deflate)),
        Some(_) => Err(Error::unsupported("Unsupported compression type")),
    }
}

/// Picks a response encoding from `Accept-Encoding` (gzip preferred).
pub fn accepted(header: Option<&str>) -> Option<Encoding> {
    let header = header?;
    let offers = |name: &str| {
        header.split(',').any(|part| {
            let mut pieces = part.split(';');
            let token = pieces.next().unwrap_or("").trim();
            let refused = pieces.any(|p| p.trim().replace(' ', "") == "q=0");
            token.eq_ignore_ascii_case(name) && !refused
        })
    };
    if offers("gzip") {
        Some(Encoding::Gzip)
    } else if offers("deflate") {
        Some(Encoding::Deflate)
    } else {
        None
    }
}

/// Inflates a body, refusing to produce more than `limit` bytes: a small
/// compressed body must not become an unbounded allocation.
pub fn decompress(encoding: Encoding, body: &[u8], limit: usize) -> Result<Bytes> {
    let reader: Box<dyn Read + '_> = match encoding {
        Encoding::Gzip => Box::new(GzDecoder::new(body)),
        Encoding::Deflate => Box::new(ZlibDecoder::new(body)),
    };
    let mut out = Vec::new();
    let read = reader.take(limit as u64 + 1).read_to_end(&mut out).map_err(|e| {
        Error::invalid(format!(
            "failed to decompress the {} request body: {e}",
            encoding.as_str()
        ))
    })?;
    if read > limit {
        return Err(Error::invalid(format!(
            "decompressed request size exceeds the maximum allowed input size of {limit} bytes. Use --http-max-input-size to increase the limit."
        )));
    }
    Ok(Bytes::from(out))
}

pub fn compress(encoding: Encoding, body: &[u8]) -> Bytes {
    fn finish<W: Write>(mut w: W, body: &[u8], done: impl FnOnce(W) -> std::io::Result<Vec<u8>>) -> Vec<u8> {
        w.write_all(body).expect("writing into memory cannot fail");
        done(w).expect("writing into memory cannot fail")
    }
    let out = match encoding {
        Encoding::Gzip => finish(GzEncoder::new(Vec::new(), Compression::fast()), body, GzEncoder::finish),
        Encoding::Deflate => finish(
            ZlibEncoder::new(Vec::new(), Compression::fast()),
            body,
            ZlibEncoder::finish,
        ),
    };
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_limits() {
        for encoding in [Encoding::Gzip, Encoding::Deflate] {
            let data = vec![7u8; 10_000];
            let packed = compress(encoding, &data);
            assert!(packed.len() < 200);
            assert_eq!(decompress(encoding, &packed, 10_000).unwrap(), data);
            let e = decompress(encoding, &packed, 9_999).unwrap_err();
            assert!(e.message().contains("exceeds the maximum allowed input size"), "{e}");
        }
        assert!(decompress(Encoding::Gzip, b"not gzip", 100).is_err());
    }

    #[test]
    fn negotiates() {
        assert_eq!(accepted(Some("deflate, gzip;q=0.5")), Some(Encoding::Gzip));
        assert_eq!(accepted(Some("gzip;q=0, deflate")), Some(Encoding::Deflate));
        assert_eq!(accepted(Some("br")), None);
        assert_eq!(content_encoding(Some("GZIP")).unwrap(), Some(Encoding::Gzip));
        assert!(content_encoding(Some("br")).is_err());
    }
}
