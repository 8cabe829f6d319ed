//! The gRPC ceiling: Sluice's own gRPC stack (same server builder, same codec, same
//! HTTP/2 settings, same accept loop and socket options) answering every call with a
//! constant OK. Whatever this reaches on a machine is the most any store can reach;
//! targets are fractions of it.

use std::future::Future;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::lanes::{self, Lanes};
use crate::listener::hardened_server as grpc_server_builder;
use crate::listener::lanes::{self as serving, LanesError, MakeRouter};
use crate::proto::rls::rate_limit_response::{Code, DescriptorStatus};
use crate::proto::rls::rate_limit_service_server::{RateLimitService, RateLimitServiceServer};
use crate::proto::rls::{RateLimitRequest, RateLimitResponse};

/// Answers OK to everything, one OK status per descriptor, deciding nothing.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ConstantOk;

#[tonic::async_trait]
impl RateLimitService for ConstantOk {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let statuses = request
            .get_ref()
            .descriptors
            .iter()
            .map(|_| DescriptorStatus {
                code: Code::Ok as i32,
                ..DescriptorStatus::default()
            })
            .collect();
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses,
            ..RateLimitResponse::default()
        }))
    }
}

/// Serves [`ConstantOk`] on `listener` until `shutdown` completes, on the serving
/// threads `sluice serve` would use for `workers`.
pub async fn serve(
    listener: TcpListener,
    workers: Option<usize>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), LanesError> {
    let (stop_tx, stop) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let make_router: MakeRouter =
        Arc::new(|| grpc_server_builder().add_service(RateLimitServiceServer::new(ConstantOk)));
    let mut serving = serving::serve(
        Lanes::spawn(lanes::count_for(workers))?,
        listener,
        None,
        None,
        &make_router,
        &stop,
    );
    Ok(serving.finished().await?)
}
