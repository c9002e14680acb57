//! Which model a request is for, read without decoding the request.
//!
//! HTTP/REST names the model in the path (the OpenAI API's in its JSON
//! body's `model`, read by the HTTP port). A gRPC request names it in field
//! 1 of its message (`model_name` of ModelInferRequest, `name` of the
//! ready, metadata, config and statistics requests), so the gateway reads
//! the message's top-level fields just far enough to find that one string,
//! skipping every other field by its length: tensors are never decoded or
//! copied, and the message is forwarded exactly as it came.

use nereid_proto::frame::{PREFIX_LEN, Prefix};
use thiserror::Error;

/// What an HTTP path asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HttpRoute {
    /// `/v2/models/{name}[/versions/{version}][/{call}]`.
    Model {
        name: String,
        version: Option<String>,
        call: ModelCall,
    },
    /// `/v2`, `/v2/health/...`: any ready pod can answer.
    Server,
    /// `/v2/repository/...`: the gateway's own answer.
    Repository,
    /// The OpenAI API (`/v1/...`).
    OpenAi(OpenAiCall),
    /// `GET /v1/models/{id}`: the gateway's own answer, from discovery.
    OpenAiModel { name: String },
}

/// The OpenAI API's calls the HTTP port serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenAiCall {
    /// `GET /v1/models`: the gateway's own answer, from discovery.
    Models,
    /// `POST /v1/completions`, `POST /v1/chat/completions`: routed by the
    /// body's `model`.
    Generate,
}

/// The calls about one model that the HTTP port forwards: KServe v2's
/// data plane and Triton's config, statistics and generate extensions,
/// which are what the gRPC port forwards too (ModelMetadata, ModelReady,
/// ModelConfig, ModelStatistics, ModelInfer; ModelStreamInfer there,
/// generate_stream here). Anything else under a model (Triton's per-model
/// trace settings) is refused, as the gRPC port refuses TraceSetting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelCall {
    /// `/v2/models/{m}`.
    Metadata,
    Ready,
    Config,
    /// `/stats`.
    Statistics,
    Infer,
    Generate,
    GenerateStream,
}

impl ModelCall {
    /// The call the path segments after the model (and its version) name,
    /// matched exactly: no `.`, `..` or escaped segment reaches a pod as
    /// something other than what was checked here.
    fn from_segments(segments: &[&str]) -> Option<ModelCall> {
        Some(match segments {
            [] => ModelCall::Metadata,
            ["ready"] => ModelCall::Ready,
            ["config"] => ModelCall::Config,
            ["stats"] => ModelCall::Statistics,
            ["infer"] => ModelCall::Infer,
            ["generate"] => ModelCall::Generate,
            ["generate_stream"] => ModelCall::GenerateStream,
            _ => return None,
        })
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum PathError {
    #[error(
        "the gateway serves the KServe v2 API (paths under /v2) and the OpenAI API's /v1/models, \
         /v1/completions and /v1/chat/completions, not {0:?}"
    )]
    NotV2(String),
    #[error("no model name in {0:?}")]
    NoModel(String),
    #[error("the model name in {0:?} is not valid percent-encoded UTF-8")]
    BadEncoding(String),
    /// Triton's endpoints about one server's own state: trace and log
    /// settings, shared memory (worded as the gRPC port words its refusal).
    #[error("{0} is about one server; the gateway routes per request, so call a pod directly for it")]
    OneServer(String),
    #[error(
        "no such endpoint: {0}; the gateway forwards a model's metadata, ready, config, stats, infer, \
         generate and generate_stream"
    )]
    NotForwarded(String),
}

/// The route of `path` (the query already removed).
pub fn from_http_path(path: &str) -> Result<HttpRoute, PathError> {
    match path.trim_end_matches('/') {
        "/v1/models" => return Ok(HttpRoute::OpenAi(OpenAiCall::Models)),
        "/v1/completions" | "/v1/chat/completions" => return Ok(HttpRoute::OpenAi(OpenAiCall::Generate)),
        other => {
            if let Some(id) = other.strip_prefix("/v1/models/") {
                let name = percent_decode(id).ok_or_else(|| PathError::BadEncoding(path.to_string()))?;
                return Ok(HttpRoute::OpenAiModel { name });
            }
        }
    }
    let Some(rest) = path
        .strip_prefix("/v2")
        .filter(|rest| rest.is_empty() || rest.starts_with('/'))
    else {
        return Err(PathError::NotV2(path.to_string()));
    };
    let mut segments = rest.split('/').filter(|s| !s.is_empty());
    match segments.next() {
        None | Some("health") => Ok(HttpRoute::Server),
        Some("repository") => Ok(HttpRoute::Repository),
        Some("models") => {
            let name = segments.next().ok_or_else(|| PathError::NoModel(path.to_string()))?;
            let name = percent_decode(name).ok_or_else(|| PathError::BadEncoding(path.to_string()))?;
            let after: Vec<&str> = segments.collect();
            let (version, call) = match after.as_slice() {
                ["versions", version, call @ ..] => (Some(version.to_string()), call),
                call => (None, call),
            };
            match ModelCall::from_segments(call) {
                Some(call) => Ok(HttpRoute::Model { name, version, call }),
                None if call == ["trace", "setting"] => Err(PathError::OneServer(path.to_string())),
                None => Err(PathError::NotForwarded(path.to_string())),
            }
        }
        Some("trace" | "logging" | "systemsharedmemory" | "cudasharedmemory") => {
            Err(PathError::OneServer(path.to_string()))
        }
        Some(_) => Err(PathError::NotForwarded(path.to_string())),
    }
}

/// The model name from its path segment. The crate passes a malformed
/// escape (`%zz`, `%4` at the end) through as text; such a name is refused
/// instead, so that no pod is asked for a name the client did not write.
fn percent_decode(text: &str) -> Option<String> {
    let escapes_valid = text.split('%').skip(1).all(|after| {
        after
            .as_bytes()
            .get(..2)
            .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    });
    if !escapes_valid {
        return None;
    }
    let decoded = percent_encoding::percent_decode_str(text).decode_utf8().ok()?;
    Some(decoded.into_owned())
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum FrameError {
    /// More bytes are needed before the name can be found.
    #[error("the gRPC message is not complete yet")]
    Incomplete,
    #[error("the gRPC message is compressed; the gateway routes uncompressed requests only")]
    Compressed,
    #[error("malformed gRPC message: {0}")]
    Malformed(&'static str),
}

/// The model named in the first gRPC message of `body` (the 5-byte gRPC
/// frame header, then the protobuf message), or `None` when the message
/// has no field 1 (an empty name).
///
/// `body` may hold only the start of the message: the name is usually its
/// first field, so a large request is routed from its first chunk without
/// waiting for (or joining) the rest. [`FrameError::Incomplete`] asks for
/// more; a message that is whole and still runs short is malformed.
pub fn from_grpc_message(body: &[u8]) -> Result<Option<&str>, FrameError> {
    let Prefix { flag, length } = Prefix::read(body).ok_or(FrameError::Incomplete)?;
    match flag {
        0 => {}
        1 => return Err(FrameError::Compressed),
        _ => return Err(FrameError::Malformed("the compressed flag is neither 0 nor 1")),
    }
    let available = &body[PREFIX_LEN..];
    let complete = available.len() >= length;
    let short = |what| {
        if complete {
            FrameError::Malformed(what)
        } else {
            FrameError::Incomplete
        }
    };
    let read_varint = |bytes| varint(bytes).map_err(|e| e.unwrap_or_else(|| short("a varint runs past the end")));
    let mut message = &available[..available.len().min(length)];
    while !message.is_empty() {
        let (key, rest) = read_varint(message)?;
        message = rest;
        let (field, wire_type) = (key >> 3, key & 7);
        match wire_type {
            0 => message = read_varint(message)?.1,
            1 => message = message.get(8..).ok_or_else(|| short("a fixed64 runs past the end"))?,
            5 => message = message.get(4..).ok_or_else(|| short("a fixed32 runs past the end"))?,
            2 => {
                let (length, rest) = read_varint(message)?;
                let length = usize::try_from(length).map_err(|_| FrameError::Malformed("a field is too long"))?;
                if field == 1 {
                    let value = rest.get(..length).ok_or_else(|| short("a field runs past the end"))?;
                    let name =
                        std::str::from_utf8(value).map_err(|_| FrameError::Malformed("the name is not UTF-8"))?;
                    return Ok(Some(name));
                }
                message = rest.get(length..).ok_or_else(|| short("a field runs past the end"))?;
            }
            _ => return Err(FrameError::Malformed("an unknown wire type")),
        }
    }
    if complete {
        Ok(None)
    } else {
        Err(FrameError::Incomplete)
    }
}

/// A protobuf varint at the start of `bytes`, and what follows it; `None`
/// in the error when the bytes end first (the caller knows whether more
/// may come), a malformed error when it runs over ten bytes.
fn varint(bytes: &[u8]) -> Result<(u64, &[u8]), Option<FrameError>> {
    let mut value = 0u64;
    for (index, byte) in bytes.iter().enumerate() {
        if index == 10 {
            return Err(Some(FrameError::Malformed("a varint runs over ten bytes")));
        }
        value |= u64::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            return Ok((value, &bytes[index + 1..]));
        }
    }
    Err(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_paths() {
        let model = |name: &str, version: Option<&str>, call| HttpRoute::Model {
            name: name.into(),
            version: version.map(str::to_string),
            call,
        };
        assert_eq!(
            from_http_path("/v2/models/resnet/infer"),
            Ok(model("resnet", None, ModelCall::Infer))
        );
        assert_eq!(
            from_http_path("/v2/models/resnet/versions/3/infer"),
            Ok(model("resnet", Some("3"), ModelCall::Infer))
        );
        assert_eq!(
            from_http_path("/v2/models/ml%2Fresnet/ready"),
            Ok(model("ml/resnet", None, ModelCall::Ready))
        );
        assert_eq!(
            from_http_path("/v2/models/resnet"),
            Ok(model("resnet", None, ModelCall::Metadata))
        );
        assert_eq!(from_http_path("/v2"), Ok(HttpRoute::Server));
        assert_eq!(from_http_path("/v2/health/ready"), Ok(HttpRoute::Server));
        assert_eq!(from_http_path("/v2/repository/index"), Ok(HttpRoute::Repository));
        assert_eq!(from_http_path("/v1/models"), Ok(HttpRoute::OpenAi(OpenAiCall::Models)));
        for path in ["/v1/completions", "/v1/chat/completions"] {
            assert_eq!(from_http_path(path), Ok(HttpRoute::OpenAi(OpenAiCall::Generate)));
        }
        assert!(matches!(from_http_path("/v1/embeddings"), Err(PathError::NotV2(_))));
        assert_eq!(
            from_http_path("/v1/models/ml/llm"),
            Ok(HttpRoute::OpenAiModel { name: "ml/llm".into() })
        );
        assert_eq!(
            from_http_path("/v1/models/ml%2Fllm"),
            Ok(HttpRoute::OpenAiModel { name: "ml/llm".into() })
        );
        assert!(matches!(from_http_path("/metrics"), Err(PathError::NotV2(_))));
        assert!(matches!(from_http_path("/v2x/models/a"), Err(PathError::NotV2(_))));
        assert!(matches!(from_http_path("/v2/models/"), Err(PathError::NoModel(_))));
        assert!(matches!(
            from_http_path("/v2/models/%ff/infer"),
            Err(PathError::BadEncoding(_))
        ));
        for bad in ["%4", "%+1", "%zz", "a%"] {
            assert!(
                matches!(
                    from_http_path(&format!("/v2/models/{bad}/infer")),
                    Err(PathError::BadEncoding(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn only_the_data_plane_of_a_model_is_forwarded() {
        let calls = [
            ("", ModelCall::Metadata),
            ("/ready", ModelCall::Ready),
            ("/config", ModelCall::Config),
            ("/stats", ModelCall::Statistics),
            ("/infer", ModelCall::Infer),
            ("/generate", ModelCall::Generate),
            ("/generate_stream", ModelCall::GenerateStream),
        ];
        for (suffix, call) in calls {
            for version in [None, Some("2")] {
                let path = match version {
                    Some(v) => format!("/v2/models/m/versions/{v}{suffix}"),
                    None => format!("/v2/models/m{suffix}"),
                };
                let expected = HttpRoute::Model {
                    name: "m".into(),
                    version: version.map(str::to_string),
                    call,
                };
                assert_eq!(from_http_path(&path), Ok(expected), "{path}");
            }
        }
        // About one server: refused as the gRPC port refuses them.
        for path in [
            "/v2/models/m/trace/setting",
            "/v2/models/m/versions/1/trace/setting",
            "/v2/trace/setting",
            "/v2/logging",
            "/v2/systemsharedmemory/status",
            "/v2/cudasharedmemory/region/r/register",
        ] {
            assert!(matches!(from_http_path(path), Err(PathError::OneServer(_))), "{path}");
        }
        // Anything else is no endpoint of the gateway's, however it is
        // spelled: a pod never sees a path it could read otherwise.
        for path in [
            "/v2/models/m/trace",
            "/v2/models/m/versions",
            "/v2/models/m/infer/extra",
            "/v2/models/m/infer/../trace/setting",
            "/v2/models/m/./infer",
            "/v2/models/m/%69nfer",
            "/v2/models/m/versions/1/2/infer",
            "/v2/models/m/load",
            "/v2/anything",
        ] {
            assert!(
                matches!(from_http_path(path), Err(PathError::NotForwarded(_))),
                "{path}"
            );
        }
    }

    /// A gRPC frame around a message made of `(field, bytes)` string fields
    /// and one varint field.
    fn frame(fields: &[(u8, &[u8])]) -> Vec<u8> {
        let mut message = vec![0x18, 0x96, 0x01]; // field 3, varint 150
        for (field, value) in fields {
            message.push((field << 3) | 2);
            let mut length = value.len();
            while length >= 0x80 {
                message.push((length as u8) | 0x80);
                length >>= 7;
            }
            message.push(length as u8);
            message.extend_from_slice(value);
        }
        nereid_proto::frame::frame(&message).unwrap().to_vec()
    }

    #[test]
    fn the_name_is_found_whatever_comes_before_it() {
        let tensor = vec![7u8; 100_000];
        let body = frame(&[(6, &tensor), (2, b"1"), (1, b"resnet")]);
        assert_eq!(from_grpc_message(&body), Ok(Some("resnet")));
        assert_eq!(from_grpc_message(&frame(&[(1, b"m")])), Ok(Some("m")));
        assert_eq!(from_grpc_message(&frame(&[(2, b"1")])), Ok(None));
    }

    #[test]
    fn the_name_of_real_requests() {
        use nereid_proto::inference::{ModelInferRequest, ModelReadyRequest};
        use prost::Message;
        let grpc = |message: Vec<u8>| nereid_proto::frame::frame(&message).unwrap();
        let infer = ModelInferRequest {
            model_name: "resnet".into(),
            model_version: "2".into(),
            id: "request-1".into(),
            raw_input_contents: vec![vec![1u8; 4096].into()],
            ..ModelInferRequest::default()
        };
        assert_eq!(from_grpc_message(&grpc(infer.encode_to_vec())), Ok(Some("resnet")));
        let ready = ModelReadyRequest {
            name: "bert".into(),
            version: String::new(),
        };
        assert_eq!(from_grpc_message(&grpc(ready.encode_to_vec())), Ok(Some("bert")));
    }

    #[test]
    fn the_start_of_a_large_message_is_enough_when_the_name_comes_first() {
        let tensor = vec![7u8; 100_000];
        let name_first = frame(&[(1, b"resnet"), (6, &tensor)]);
        assert_eq!(from_grpc_message(&name_first[..64]), Ok(Some("resnet")));
        let tensor_first = frame(&[(6, &tensor), (1, b"resnet")]);
        assert_eq!(from_grpc_message(&tensor_first[..64]), Err(FrameError::Incomplete));
        // Cut inside the name's length or bytes: more is needed, nothing is wrong.
        assert_eq!(from_grpc_message(&name_first[..10]), Err(FrameError::Incomplete));
        let long_varint = [
            0, 0, 0, 0, 20, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ];
        assert!(matches!(from_grpc_message(&long_varint), Err(FrameError::Malformed(_))));
    }

    #[test]
    fn partial_compressed_and_malformed_messages() {
        let body = frame(&[(1, b"resnet")]);
        assert_eq!(from_grpc_message(&body[..3]), Err(FrameError::Incomplete));
        assert_eq!(from_grpc_message(&body[..body.len() - 1]), Err(FrameError::Incomplete));
        let mut compressed = body.clone();
        compressed[0] = 1;
        assert_eq!(from_grpc_message(&compressed), Err(FrameError::Compressed));
        let mut flag = body.clone();
        flag[0] = 9;
        assert!(matches!(from_grpc_message(&flag), Err(FrameError::Malformed(_))));
        // A length-delimited field that claims more than the message holds.
        let lying = [0, 0, 0, 0, 3, 0x0a, 0x7f, b'a'];
        assert!(matches!(from_grpc_message(&lying), Err(FrameError::Malformed(_))));
        // Wire type 7 does not exist.
        let unknown = [0, 0, 0, 0, 1, 0x0f];
        assert!(matches!(from_grpc_message(&unknown), Err(FrameError::Malformed(_))));
        let not_utf8 = frame(&[(1, &[0xff, 0xfe])]);
        assert!(matches!(from_grpc_message(&not_utf8), Err(FrameError::Malformed(_))));
        let endless_varint = [0, 0, 0, 0, 2, 0x08, 0xff];
        assert!(matches!(
            from_grpc_message(&endless_varint),
            Err(FrameError::Malformed(_))
        ));
    }
}
