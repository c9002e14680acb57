//! Per-namespace bearer tokens: which namespaces a request's
//! `authorization: Bearer <token>` opens ([`crate::authorize`] decides,
//! per request, which namespace that has to be).
//!
//! `--namespace-token NAMESPACE=FILE` gives a namespace a token, FILE's
//! content (a mounted Secret's key), with the whitespace around it trimmed
//! (the newline an editor or `echo` adds; HTTP strips the spaces around a
//! header value anyway). A namespace may have several (a rotation's old
//! and new token), and a request carrying any of them reaches its models.
//! A namespace with none is open to every client, as the gateway was before
//! namespaces had tokens, unless `--require-namespace-tokens`: then it
//! refuses everything.
//!
//! Files are read at start, where a missing or empty one stops the gateway;
//! then each is looked at again at most once a second, on the request path,
//! and read again when its modification time or size changed, as the
//! kubelet swaps a mounted Secret's files when the Secret changes. A file
//! that cannot be read then keeps its last token, with a warning.
//!
//! Tokens are compared in a time that depends on their lengths only
//! ([`same_token`]), and never logged: the store's `Debug` shows the
//! namespaces and file paths, not what the files hold.

use std::collections::HashMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::{HeaderMap, header};
use parking_lot::Mutex;
use thiserror::Error;

/// How often a token file is looked at for a change, at most.
pub const RECHECK_INTERVAL: Duration = Duration::from_secs(1);

/// The largest token file read (8 KiB): a bearer token is tens of bytes,
/// and a header list is 16 KiB at most
/// ([`crate::limits::MAX_HEADER_LIST_BYTES`]).
pub const MAX_TOKEN_FILE_BYTES: u64 = 8 << 10;

/// Why a token file could not be taken.
#[derive(Debug, Error)]
pub enum TokenError {
    #[error("cannot read {path}: {error}")]
    Read { path: PathBuf, error: std::io::Error },
    #[error("{path} holds no token (it is empty or whitespace)")]
    Empty { path: PathBuf },
    #[error("{path} is larger than 8 KiB: not a token")]
    TooLarge { path: PathBuf },
    #[error("{path} holds control characters inside its token, which no header can carry")]
    NotAHeaderValue { path: PathBuf },
}

/// Each protected namespace's tokens, and whether namespaces without one
/// are open.
pub struct NamespaceTokens {
    namespaces: HashMap<String, Vec<TokenFile>>,
    /// `--require-namespace-tokens`: a namespace without a token refuses
    /// every request.
    required: bool,
}

impl std::fmt::Debug for NamespaceTokens {
    /// Namespaces and paths only: never a token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut files: Vec<(&str, &Path)> = self
            .namespaces
            .iter()
            .flat_map(|(namespace, files)| files.iter().map(move |file| (namespace.as_str(), file.path.as_path())))
            .collect();
        files.sort_unstable();
        f.debug_struct("NamespaceTokens")
            .field("files", &files)
            .field("required", &self.required)
            .finish()
    }
}

impl NamespaceTokens {
    /// No token anywhere, nothing required: every namespace open.
    pub fn open() -> Self {
        NamespaceTokens {
            namespaces: HashMap::new(),
            required: false,
        }
    }

    /// Reads each `(namespace, file)`'s token; `required` closes the
    /// namespaces that get none.
    pub fn load(files: &[(String, PathBuf)], required: bool) -> Result<Self, TokenError> {
        let now = Instant::now();
        let mut namespaces: HashMap<String, Vec<TokenFile>> = HashMap::new();
        for (namespace, path) in files {
            let file = TokenFile::open(namespace, path, now)?;
            namespaces.entry(namespace.clone()).or_default().push(file);
        }
        Ok(NamespaceTokens { namespaces, required })
    }

    /// Whether requests are checked at all: not when no namespace has a
    /// token and none is required (every request then goes where its name
    /// leads, as before namespaces had tokens).
    pub fn enforced(&self) -> bool {
        self.required || !self.namespaces.is_empty()
    }

    /// The namespaces that have a token, in order (for the start-up log).
    pub fn protected(&self) -> Vec<&str> {
        let mut namespaces: Vec<&str> = self.namespaces.keys().map(String::as_str).collect();
        namespaces.sort_unstable();
        namespaces
    }

    /// Whether a request carrying `presented` (its bearer token, if any)
    /// may reach the models of `namespace`.
    pub fn allows(&self, namespace: &str, presented: Option<&[u8]>) -> bool {
        self.allows_at(namespace, presented, Instant::now())
    }

    /// [`Self::allows`] at `now` (when a token file is looked at again).
    pub fn allows_at(&self, namespace: &str, presented: Option<&[u8]>, now: Instant) -> bool {
        let Some(files) = self.namespaces.get(namespace) else {
            return !self.required;
        };
        let Some(presented) = presented else {
            return false;
        };
        // Every token compared, none skipped after a match: how long this
        // takes does not tell which of a namespace's tokens matched.
        files.iter().fold(false, |matched, file| {
            same_token(presented, &file.current(now)) | matched
        })
    }
}

/// The token of an `authorization: Bearer <token>` header, the scheme in
/// any case (RFC 9110 §11.1); `None` without one, or with another scheme.
pub fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, rest) = value.split_at_checked(b"bearer".len())?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || rest.first() != Some(&b' ') {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// Whether `presented` is `expected`, in a time that depends on their
/// lengths only: every byte of `expected` is compared, wherever the first
/// difference is, so timing the answers does not find the token byte by
/// byte. (The length of the expected token is not hidden: guessing it
/// gains nothing without its bytes.)
pub fn same_token(presented: &[u8], expected: &[u8]) -> bool {
    let mut difference = presented.len() ^ expected.len();
    for (index, &byte) in expected.iter().enumerate() {
        let other = presented.get(index).copied().unwrap_or(0);
        difference |= usize::from(byte ^ other);
    }
    // Keeps the compiler from turning the loop into an early exit.
    std::hint::black_box(difference) == 0
}

/// One token file and what was last read from it.
struct TokenFile {
    path: PathBuf,
    namespace: String,
    state: Mutex<FileState>,
}

struct FileState {
    token: Arc<[u8]>,
    stamp: Stamp,
    /// When the file was last looked at.
    checked: Instant,
    /// A failed look was warned of: not again until one succeeds.
    warned: bool,
}

/// What tells that a file changed without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
}

impl Stamp {
    fn of(metadata: &std::fs::Metadata) -> Self {
        Stamp {
            modified: metadata.modified().ok(),
            len: metadata.len(),
        }
    }
}

impl TokenFile {
    fn open(namespace: &str, path: &Path, now: Instant) -> Result<Self, TokenError> {
        let (token, stamp) = read_token(path)?;
        Ok(TokenFile {
            path: path.to_path_buf(),
            namespace: namespace.to_string(),
            state: Mutex::new(FileState {
                token,
                stamp,
                checked: now,
                warned: false,
            }),
        })
    }

    /// The token, looking at the file again if it was last looked at
    /// [`RECHECK_INTERVAL`] or more before `now`. A look is one `stat` (a
    /// read when the file changed), once a second: short enough to make on
    /// the request path, under the lock, so that concurrent requests do not
    /// all look at once.
    fn current(&self, now: Instant) -> Arc<[u8]> {
        let mut state = self.state.lock();
        if now.saturating_duration_since(state.checked) >= RECHECK_INTERVAL {
            state.checked = now;
            self.refresh(&mut state);
        }
        Arc::clone(&state.token)
    }

    fn refresh(&self, state: &mut FileState) {
        let changed = std::fs::metadata(&self.path)
            .map_err(|error| TokenError::Read {
                path: self.path.clone(),
                error,
            })
            .map(|metadata| Stamp::of(&metadata) != state.stamp);
        let read = match changed {
            Ok(false) => Ok(None),
            Ok(true) => read_token(&self.path).map(Some),
            Err(error) => Err(error),
        };
        match read {
            Ok(None) => state.warned = false,
            Ok(Some((token, stamp))) => {
                state.token = token;
                state.stamp = stamp;
                state.warned = false;
                tracing::info!(namespace = %self.namespace, path = %self.path.display(), "namespace token read again");
            }
            Err(error) if !state.warned => {
                state.warned = true;
                tracing::warn!(
                    namespace = %self.namespace, %error,
                    "the namespace token file cannot be read; keeping the token read before"
                );
            }
            Err(_) => {}
        }
    }
}

/// A token file's token and stamp, from one open file (so that the stamp
/// is the read content's).
fn read_token(path: &Path) -> Result<(Arc<[u8]>, Stamp), TokenError> {
    let failed = |error| TokenError::Read {
        path: path.to_path_buf(),
        error,
    };
    let file = std::fs::File::open(path).map_err(failed)?;
    let stamp = Stamp::of(&file.metadata().map_err(failed)?);
    let mut content = Vec::new();
    file.take(MAX_TOKEN_FILE_BYTES + 1)
        .read_to_end(&mut content)
        .map_err(failed)?;
    if content.len() as u64 > MAX_TOKEN_FILE_BYTES {
        return Err(TokenError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    let token = parse_token(&content).map_err(|problem| problem.at(path))?;
    Ok((Arc::from(token), stamp))
}

/// What is wrong with a token file's content.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Problem {
    Empty,
    NotAHeaderValue,
}

impl Problem {
    fn at(self, path: &Path) -> TokenError {
        let path = path.to_path_buf();
        match self {
            Problem::Empty => TokenError::Empty { path },
            Problem::NotAHeaderValue => TokenError::NotAHeaderValue { path },
        }
    }
}

/// The token a file's content holds: the content with the whitespace
/// around it trimmed.
fn parse_token(content: &[u8]) -> Result<&[u8], Problem> {
    let token = content.trim_ascii();
    if token.is_empty() {
        return Err(Problem::Empty);
    }
    if token.iter().any(|&byte| (byte < b' ' && byte != b'\t') || byte == 0x7f) {
        return Err(Problem::NotAHeaderValue);
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    #[test]
    fn tokens_are_equal_only_when_every_byte_and_the_length_are() {
        assert!(same_token(b"s3cret", b"s3cret"));
        let others: [&[u8]; 6] = [b"s3cre", b"s3cret!", b"S3cret", b"s3creT", b"", b"\0\0\0\0\0\0"];
        for other in others {
            assert!(!same_token(other, b"s3cret"), "{other:?}");
        }
        // A presented token that is the expected one plus bytes, or a
        // prefix of it, differs by its length alone.
        assert!(!same_token(b"s3cret\0", b"s3cret"));
        assert!(!same_token(b"s3c", b"s3c\0\0\0"));
    }

    #[test]
    fn a_token_file_is_its_content_trimmed() {
        assert_eq!(parse_token(b"abc\n"), Ok(&b"abc"[..]));
        assert_eq!(parse_token(b"abc\r\n"), Ok(&b"abc"[..]));
        assert_eq!(parse_token(b"  a b\tc \n\n"), Ok(&b"a b\tc"[..]));
        assert_eq!(parse_token(b"\n"), Err(Problem::Empty));
        assert_eq!(parse_token(b""), Err(Problem::Empty));
        assert_eq!(parse_token(b"ab\ncd\n"), Err(Problem::NotAHeaderValue));
        assert_eq!(parse_token(b"ab\0cd"), Err(Problem::NotAHeaderValue));
    }

    #[test]
    fn the_bearer_token_of_a_request() {
        let with = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::AUTHORIZATION, HeaderValue::from_static(value));
            headers
        };
        assert_eq!(bearer(&with("Bearer s3cret")), Some(&b"s3cret"[..]));
        assert_eq!(bearer(&with("bearer  s3cret")), Some(&b"s3cret"[..]));
        assert_eq!(bearer(&with("BEARER s3cret")), Some(&b"s3cret"[..]));
        for none in ["Basic czNjcmV0", "Bearer", "Bearer ", "Bearers3cret", "s3cret"] {
            assert_eq!(bearer(&with(none)), None, "{none}");
        }
        assert_eq!(bearer(&HeaderMap::new()), None);
    }

    /// A fresh folder for this test's token files.
    fn folder(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("nereid-gateway-tokens-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn namespaces_with_a_token_want_it_and_others_are_open_unless_required() {
        let dir = folder("open");
        let (ml, ml_next) = (dir.join("ml"), dir.join("ml-next"));
        std::fs::write(&ml, "tok-7f3a\n").unwrap();
        std::fs::write(&ml_next, "tok-9c1b\n").unwrap();
        let files = [("ml".to_string(), ml), ("ml".to_string(), ml_next)];
        let tokens = NamespaceTokens::load(&files, false).unwrap();
        assert!(tokens.enforced());
        assert_eq!(tokens.protected(), ["ml"]);
        assert!(tokens.allows("ml", Some(b"tok-7f3a")));
        assert!(tokens.allows("ml", Some(b"tok-9c1b")));
        assert!(!tokens.allows("ml", Some(b"other")));
        assert!(!tokens.allows("ml", None));
        assert!(tokens.allows("team", None));
        assert!(tokens.allows("team", Some(b"anything")));

        let required = NamespaceTokens::load(&files, true).unwrap();
        assert!(required.allows("ml", Some(b"tok-9c1b")));
        assert!(!required.allows("team", None));
        assert!(!required.allows("team", Some(b"tok-9c1b")));

        let open = NamespaceTokens::open();
        assert!(!open.enforced() && open.allows("ml", None));
        assert!(NamespaceTokens::load(&[], true).unwrap().enforced());

        // Never a token in what the store shows of itself.
        let shown = format!("{tokens:?}");
        assert!(shown.contains("ml-next") && !shown.contains("tok-"), "{shown}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_missing_or_empty_file_stops_the_start() {
        let dir = folder("bad");
        let empty = dir.join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let error = NamespaceTokens::load(&[("ml".into(), empty)], false).unwrap_err();
        assert!(matches!(error, TokenError::Empty { .. }), "{error}");
        let error = NamespaceTokens::load(&[("ml".into(), dir.join("missing"))], false).unwrap_err();
        assert!(matches!(error, TokenError::Read { .. }), "{error}");
        let large = dir.join("large");
        std::fs::write(&large, vec![b'a'; MAX_TOKEN_FILE_BYTES as usize + 1]).unwrap();
        let error = NamespaceTokens::load(&[("ml".into(), large)], false).unwrap_err();
        assert!(matches!(error, TokenError::TooLarge { .. }), "{error}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_changed_file_is_read_again_at_most_once_a_second() {
        let dir = folder("rotate");
        let path = dir.join("ml");
        std::fs::write(&path, "first\n").unwrap();
        let tokens = NamespaceTokens::load(&[("ml".into(), path.clone())], false).unwrap();
        let start = Instant::now();
        assert!(tokens.allows_at("ml", Some(b"first"), start));

        // A new token of another length: a changed size, whatever the
        // file system's clock resolution.
        std::fs::write(&path, "second-token\n").unwrap();
        assert!(
            tokens.allows_at("ml", Some(b"first"), start + Duration::from_millis(500)),
            "not looked at again within the second"
        );
        let later = start + RECHECK_INTERVAL;
        assert!(tokens.allows_at("ml", Some(b"second-token"), later));
        assert!(!tokens.allows_at("ml", Some(b"first"), later));

        // A file that goes away keeps the last token.
        std::fs::remove_file(&path).unwrap();
        let gone = later + RECHECK_INTERVAL;
        assert!(tokens.allows_at("ml", Some(b"second-token"), gone));
        // And one that comes back empty too.
        std::fs::write(&path, "\n").unwrap();
        assert!(tokens.allows_at("ml", Some(b"second-token"), gone + RECHECK_INTERVAL));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
