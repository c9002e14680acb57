//! The codec of every generated service: prost's, with the decoded size of
//! each message admitted before it is decoded.
//!
//! tonic decodes a message where the call is served, with no way to ask the
//! server whether the memory is there: a message costs its wire bytes in the
//! server's budget (counted as the body arrives), and its decoded size, which
//! can be a hundred times more, was counted nowhere. Here the decoder first
//! asks [`footprint`](crate::footprint::footprint) what the message will
//! hold, then asks the [`DecodeAllowance`] of the task it runs in (the server
//! sets one around each call with [`with_allowance`]), and decodes only if
//! the allowance grants it. Outside such a scope (clients, tests) messages
//! are decoded as prost would.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use bytes::Buf;
use prost::{Message, Name};
use tokio::task::futures::TaskLocalFuture;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

use crate::footprint::footprint_of;

/// Grants (and accounts for) the memory a message will take once decoded.
pub trait DecodeAllowance: Send + Sync {
    /// `decoded` heap bytes for a message of type `message` that arrived as
    /// `wire` bytes; an error refuses the message (and fails the call).
    fn admit(&self, message: &str, wire: usize, decoded: usize) -> Result<(), Status>;
}

tokio::task_local! {
    static ALLOWANCE: Arc<dyn DecodeAllowance>;
}

/// A future run under a decode allowance, named so that a service can
/// return it without boxing it.
pub type WithAllowance<F> = TaskLocalFuture<Arc<dyn DecodeAllowance>, F>;

/// Runs `future` with `allowance` deciding every message it decodes.
pub fn with_allowance<F: Future>(allowance: Arc<dyn DecodeAllowance>, future: F) -> WithAllowance<F> {
    ALLOWANCE.scope(allowance, future)
}

/// Asks the current task's allowance, if any, for `wire` decoded as `M`.
pub fn admit<M: Name + 'static>(wire: &[u8]) -> Result<(), Status> {
    ALLOWANCE
        .try_with(|allowance| {
            let (decoded, name) = footprint_of::<M>(wire).map_err(|e| Status::internal(e.to_string()))?;
            allowance.admit(name, wire.len(), decoded)
        })
        .unwrap_or(Ok(()))
}

/// prost's codec, admitting each decoded message first.
#[derive(Debug, Clone)]
pub struct BoundedCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for BoundedCodec<T, U> {
    fn default() -> Self {
        BoundedCodec(PhantomData)
    }
}

impl<T, U> Codec for BoundedCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Name + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = BoundedEncoder<T>;
    type Decoder = BoundedDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        BoundedEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        BoundedDecoder(PhantomData)
    }
}

#[derive(Debug)]
pub struct BoundedEncoder<T>(PhantomData<T>);

impl<T: Message> Encoder for BoundedEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        // EncodeBuf grows as needed: encoding cannot run out of room.
        item.encode(buf).map_err(|e| Status::internal(e.to_string()))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

#[derive(Debug)]
pub struct BoundedDecoder<U>(PhantomData<U>);

impl<U: Message + Name + Default + 'static> Decoder for BoundedDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        // The decode buffer holds the whole message in one piece.
        admit::<U>(&buf.chunk()[..buf.remaining().min(buf.chunk().len())])?;
        // As tonic's prost codec: a message that does not parse is INTERNAL.
        U::decode(buf).map(Some).map_err(|e| Status::internal(e.to_string()))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::inference::ModelInferRequest;
    use crate::inference::model_infer_request::InferInputTensor;

    /// Grants up to a limit and remembers what it granted.
    struct Limit(usize, AtomicUsize);
    impl DecodeAllowance for Limit {
        fn admit(&self, message: &str, _wire: usize, decoded: usize) -> Result<(), Status> {
            if decoded > self.0 {
                return Err(Status::resource_exhausted(format!("{message}: {decoded}")));
            }
            self.1.fetch_add(decoded, Ordering::Relaxed);
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_message_is_decoded_only_if_its_allowance_grants_its_decoded_size() {
        let request = ModelInferRequest {
            inputs: vec![InferInputTensor::default(); 1000],
            ..Default::default()
        };
        let wire = request.encode_to_vec();
        // Outside a scope: decoded as prost would.
        assert!(admit::<ModelInferRequest>(&wire).is_ok());

        let small = Arc::new(Limit(wire.len() * 10, AtomicUsize::new(0)));
        let refused = with_allowance(small, async { admit::<ModelInferRequest>(&wire) }).await;
        let status = refused.unwrap_err();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(
            status.message().starts_with("inference.ModelInferRequest"),
            "{status:?}"
        );

        let large = Arc::new(Limit(usize::MAX, AtomicUsize::new(0)));
        with_allowance(large.clone(), async { admit::<ModelInferRequest>(&wire) })
            .await
            .unwrap();
        assert!(large.1.load(Ordering::Relaxed) > 100 * wire.len());
    }
}
