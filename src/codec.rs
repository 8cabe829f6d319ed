//! The protobuf codec of the RLS service, server and client: tonic's prost codec with
//! buffers sized for rate limit messages.
//!
//! tonic starts every call's encode and decode buffers at 8 KiB. An RLS request is a few
//! hundred bytes and its answer less, so two 8 KiB blocks per call were the largest
//! allocations on the request path and sent glibc's malloc through its large-chunk path
//! (and `malloc_consolidate`) on every call. A bigger message still fits: the buffers
//! grow as tonic writes or reads into them.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// First capacity of a call's encode and decode buffers: within the allocator's
/// small-block caches, and room for any ordinary RLS message.
pub(crate) const BUFFER_BYTES: usize = 1024;

/// How much a streaming encoder writes before yielding (tonic's default; RLS calls are
/// unary).
const YIELD_THRESHOLD: usize = 32 * 1024;

/// [`ProstCodec`] with [`BUFFER_BYTES`] buffers; `codec_path` of the generated code.
#[derive(Debug)]
pub(crate) struct RlsCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for RlsCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for RlsCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(buffer_settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(buffer_settings())
    }
}

fn buffer_settings() -> BufferSettings {
    BufferSettings::new(BUFFER_BYTES, YIELD_THRESHOLD)
}
