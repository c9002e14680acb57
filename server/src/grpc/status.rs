//! Core errors as gRPC statuses, mapped as Triton maps them.

use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

use crate::error::{Error, ErrorKind};

pub fn code(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::InvalidArgument => Code::InvalidArgument,
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::Unavailable | ErrorKind::NotServing => Code::Unavailable,
        ErrorKind::Unsupported => Code::Unimplemented,
        ErrorKind::Internal => Code::Internal,
        ErrorKind::AlreadyExists => Code::AlreadyExists,
        ErrorKind::ResourceExhausted => Code::ResourceExhausted,
        ErrorKind::PermissionDenied => Code::PermissionDenied,
    }
}

pub fn to_status(error: Error) -> Status {
    let mut status = Status::new(code(error.kind()), error.message());
    if error.kind() == ErrorKind::NotServing {
        status
            .metadata_mut()
            .insert(nereid_proto::NOT_SERVING_HEADER, MetadataValue::from_static("1"));
    }
    status
}
