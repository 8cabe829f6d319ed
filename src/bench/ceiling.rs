//! The gRPC ceiling: Sluice's own gRPC stack (same server builder, same codec, same
//! HTTP/2 settings, same accept loop and socket options) answering every call with a
//! constant OK. Whatever this reaches on a machine is the most any store can reach;
//! targets are fractions of it.

use std::future::Future;

use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

use crate::listener::incoming;
use crate::proto::rls::rate_limit_response::{Code, DescriptorStatus};
use crate::proto::rls::rate_limit_service_server::{RateLimitService, RateLimitServiceServer};
use crate::proto::rls::{RateLimitRequest, RateLimitResponse};
use crate::server::grpc_server_builder;

/// Answers OK to everything, one OK status per descriptor, deciding nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct ConstantOk;

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

/// Serves [`ConstantOk`] on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    grpc_server_builder()
        .add_service(RateLimitServiceServer::new(ConstantOk))
        .serve_with_incoming_shutdown(incoming(listener, None), shutdown)
        .await
}
