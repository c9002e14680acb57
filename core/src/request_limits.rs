//! The shape of one inference request, bounded the same whatever the
//! protocol (JSON over HTTP, protobuf over gRPC, a stream's messages).
//!
//! The limits are far above what any model uses (ONNX Runtime models rarely
//! exceed rank 8; KServe requests carry a handful of parameters), and they
//! are checked before the request's parts are converted, so a request of
//! many empty entries costs nothing beyond its (budgeted) decoding.

use crate::error::{Error, Result};

/// The most dimensions a tensor shape may have.
pub const MAX_DIMS: usize = 64;
/// The most keys one `parameters` object may have.
pub const MAX_PARAMETERS: usize = 64;
/// The most inputs, or outputs, one request may name.
pub const MAX_TENSORS: usize = 4096;

/// Refuses a count over its limit, naming what was counted. `what` is
/// formatted only for a refusal (`format_args!` costs nothing until then),
/// since it is checked for every tensor of every request.
pub fn check(what: impl std::fmt::Display, count: usize, limit: usize) -> Result<()> {
    if count > limit {
        return Err(Error::invalid(format!(
            "{what}: {count} is more than the limit of {limit}"
        )));
    }
    Ok(())
}
