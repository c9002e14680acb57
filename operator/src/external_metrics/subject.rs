//! The common name of an X.509 certificate's subject: the one field the
//! request-header check needs, read with a few lines of DER rather than a
//! certificate-parsing dependency. The certificate has already been verified
//! by rustls, so this only walks a well-formed structure; anything
//! unexpected gives `None`, which refuses the request.
//!
//! ```text
//! Certificate  ::= SEQUENCE { tbsCertificate, signatureAlgorithm, signature }
//! TBSCertificate ::= SEQUENCE { [0] version OPTIONAL, serialNumber, signature,
//!                               issuer Name, validity, subject Name, ... }
//! Name ::= SEQUENCE OF SET OF SEQUENCE { type OID, value ANY }
//! ```

use rustls::pki_types::CertificateDer;

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
const VERSION: u8 = 0xa0;
/// 2.5.4.3, id-at-commonName.
const COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
/// UTF8String, PrintableString, IA5String, TeletexString.
const STRINGS: [u8; 4] = [0x0c, 0x13, 0x16, 0x14];

/// The subject's (last) common name, if it has one.
pub fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (tag, certificate, _) = element(cert.as_ref())?;
    expect(tag, SEQUENCE)?;
    let (tag, mut tbs, _) = element(certificate)?;
    expect(tag, SEQUENCE)?;
    if tbs.first() == Some(&VERSION) {
        tbs = element(tbs)?.2;
    }
    // serialNumber, signature, issuer, validity.
    for _ in 0..4 {
        tbs = element(tbs)?.2;
    }
    let (tag, mut subject, _) = element(tbs)?;
    expect(tag, SEQUENCE)?;
    let mut found = None;
    while !subject.is_empty() {
        let (tag, mut set, rest) = element(subject)?;
        expect(tag, SET)?;
        subject = rest;
        while !set.is_empty() {
            let (tag, attribute, rest) = element(set)?;
            expect(tag, SEQUENCE)?;
            set = rest;
            let (tag, oid, value) = element(attribute)?;
            expect(tag, OID)?;
            if oid == COMMON_NAME {
                let (tag, text, _) = element(value)?;
                if STRINGS.contains(&tag) {
                    found = Some(String::from_utf8(text.to_vec()).ok()?);
                }
            }
        }
    }
    found
}

fn expect(tag: u8, wanted: u8) -> Option<()> {
    (tag == wanted).then_some(())
}

/// One DER element at the start of `input`: its tag, its contents and what
/// follows it. Definite lengths only (DER has no other).
fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let length = if first < 0x80 {
        usize::from(first)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 {
            return None;
        }
        let (bytes, after) = rest.split_at_checked(count)?;
        rest = after;
        bytes.iter().fold(0usize, |n, b| (n << 8) | usize::from(*b))
    };
    let (contents, after) = rest.split_at_checked(length)?;
    Some((tag, contents, after))
}

#[cfg(test)]
mod tests {
    use rustls::pki_types::pem::PemObject;

    use super::*;

    #[test]
    fn reads_the_subjects_common_name() {
        let pem = include_str!("testdata/front-proxy-client.pem");
        let cert = CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        assert_eq!(common_name(&cert).as_deref(), Some("front-proxy-client"));
    }

    #[test]
    fn anything_malformed_has_no_name() {
        assert_eq!(common_name(&CertificateDer::from(vec![])), None);
        assert_eq!(common_name(&CertificateDer::from(vec![0x30, 0x05, 0x30])), None);
        assert_eq!(
            common_name(&CertificateDer::from(vec![0x30, 0x84, 0xff, 0xff, 0xff, 0xff])),
            None
        );
        let pem = include_str!("testdata/front-proxy-client.pem");
        let mut der = CertificateDer::from_pem_slice(pem.as_bytes()).unwrap().to_vec();
        der.truncate(der.len() / 2);
        assert_eq!(common_name(&CertificateDer::from(der)), None);
    }
}
