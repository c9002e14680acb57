//! `Content-Encoding` on requests and `Accept-Encoding` on responses
//! (gzip and deflate, as Triton and tritonclient use them).

use std::io::{Read, Write};

use bytes::Bytes;
use flate2::Compression;
use flate2::read::{GzDecoder, ZlibDecoder};
use flate2::write::{GzEncoder, ZlibEncoder};

use super::body::SizeLimit;
use crate::error::{Error, Result};
use crate::memory_budget::Reservation;

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
/// compressed body must not become an unbounded allocation. The output is
/// reserved in `reservation` as it grows.
pub fn decompress(
    encoding: Encoding,
    body: &[u8],
    limit: usize,
    kind: SizeLimit,
    reservation: &mut Reservation,
) -> Result<Bytes> {
    let mut reader: Box<dyn Read + '_> = match encoding {
        Encoding::Gzip => Box::new(GzDecoder::new(body)),
        Encoding::Deflate => Box::new(ZlibDecoder::new(body)),
    };
    const CHUNK: usize = 64 << 10;
    let mut out: Vec<u8> = Vec::new();
    loop {
        if out.len() > limit {
            return Err(kind.refusal(true, limit));
        }
        let start = out.len();
        // Reserve what the vector may grow to before it grows.
        if out.capacity() - start < CHUNK {
            let grown = (out.capacity() * 2).clamp(CHUNK, limit.saturating_add(CHUNK));
            reservation.grow(grown - out.capacity())?;
            out.reserve_exact(grown - out.len());
        }
        out.resize(start + CHUNK, 0);
        let read = reader.read(&mut out[start..]).map_err(|e| {
            Error::invalid(format!(
                "failed to decompress the {} request body: {e}",
                encoding.as_str()
            ))
        })?;
        out.truncate(start + read);
        if read == 0 {
            return Ok(Bytes::from(out));
        }
    }
}

/// The most bytes [`compress`] writes for `len` bytes: deflate's worst case
/// (stored blocks, 5 bytes per 64 KiB) and gzip's header and trailer. Its
/// output buffer is this large from the start, so it never grows.
pub fn max_compressed_len(len: usize) -> usize {
    len.saturating_add(len / 1024).saturating_add(64)
}

/// What `write` writes, compressed as it is written (the text is never
/// whole in memory), into a buffer of `capacity` bytes to start with.
pub fn compress_with(
    encoding: Encoding,
    capacity: usize,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<Vec<u8>> {
    let output = Vec::with_capacity(capacity);
    match encoding {
        Encoding::Gzip => {
            let mut encoder = GzEncoder::new(output, Compression::fast());
            write(&mut encoder)?;
            encoder.finish()
        }
        Encoding::Deflate => {
            let mut encoder = ZlibEncoder::new(output, Compression::fast());
            write(&mut encoder)?;
            encoder.finish()
        }
    }
}

/// `body` compressed.
pub fn compress(encoding: Encoding, body: &[u8]) -> Bytes {
    let packed = compress_with(encoding, max_compressed_len(body.len()), |w| w.write_all(body));
    Bytes::from(packed.expect("writing into memory cannot fail"))
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
            let mut reservation = Reservation::default();
            assert_eq!(
                decompress(encoding, &packed, 10_000, SizeLimit::Input, &mut reservation).unwrap(),
                data
            );
            let e = decompress(encoding, &packed, 9_999, SizeLimit::Input, &mut reservation).unwrap_err();
            assert!(e.message().contains("exceeds the maximum allowed input size"), "{e}");
        }
        assert!(
            decompress(
                Encoding::Gzip,
                b"not gzip",
                100,
                SizeLimit::Input,
                &mut Reservation::default()
            )
            .is_err()
        );
    }

    #[test]
    fn inflating_is_reserved_and_a_bomb_is_refused_by_the_budget() {
        let data = vec![0u8; 1 << 20];
        let packed = compress(Encoding::Gzip, &data);
        let budget = crate::memory_budget::MemoryBudget::new(256 << 10);
        let mut reservation = budget.reservation();
        let e = decompress(Encoding::Gzip, &packed, 1 << 20, SizeLimit::Input, &mut reservation).unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::ResourceExhausted);
        drop(reservation);
        let budget = crate::memory_budget::MemoryBudget::new(4 << 20);
        let mut reservation = budget.reservation();
        let out = decompress(Encoding::Gzip, &packed, 1 << 20, SizeLimit::Input, &mut reservation).unwrap();
        assert_eq!(out.len(), 1 << 20);
        assert!(reservation.bytes() >= out.len(), "{} reserved", reservation.bytes());
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
