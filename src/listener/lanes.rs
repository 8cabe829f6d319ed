//! Serving the gRPC listener on the lanes ([`crate::lanes`]): connections are dealt
//! in turn to the serving threads, each with its own copy of the tonic server, so a call
//! is read, decided and answered on one thread. The admin port and reloads stay on the
//! main runtime.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tonic::transport::server::Router;

use super::incoming::incoming_dealt;
use super::stopped;
use super::tls::ReloadingTls;
use crate::lanes::{Lanes, Work};

/// Connections dealt to one lane but not yet taken up by it.
const DEALT_QUEUE: usize = 1024;

/// Pause after an accept error (e.g. out of file descriptors) before trying again.
const ACCEPT_ERROR_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

/// Builds a lane's gRPC router (its services; each lane serves its own copy).
pub(crate) type MakeRouter = Arc<dyn Fn() -> Router + Send + Sync>;

/// Why lanes could not start or stopped serving (the bench's ceiling server).
#[cfg(feature = "bench")]
#[derive(Debug, thiserror::Error)]
pub enum LanesError {
    /// A lane's server failed.
    #[error("gRPC serving: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// A serving thread or its runtime could not start.
    #[error(transparent)]
    Start(#[from] crate::lanes::StartError),
}

/// Lanes serving a listener (see [`serve`]).
pub(crate) struct Serving {
    lanes: Vec<ServingLane>,
    dealer: tokio::task::JoinHandle<()>,
}

struct ServingLane {
    done: Option<oneshot::Receiver<Result<(), tonic::transport::Error>>>,
    /// Dropped to make the lane close its connections at once.
    abort: Option<oneshot::Sender<()>>,
}

/// Makes every lane serve `make_router()`'s router until `stop` turns true, and starts
/// a task on the current runtime that accepts on `listener` and deals the connections
/// in turn. With `tls`, each lane handshakes its own connections; with `close_after`,
/// each connection's socket is shut down that long after it is accepted.
pub(crate) fn serve(
    lanes: Lanes,
    listener: TcpListener,
    tls: Option<Arc<ReloadingTls>>,
    close_after: Option<std::time::Duration>,
    make_router: &MakeRouter,
    stop: &watch::Receiver<bool>,
) -> Serving {
    let count = lanes.handles().len();
    let mut serving = Vec::with_capacity(count);
    let mut dealt = Vec::with_capacity(count);
    lanes.run(|_| {
        let (deal_tx, deal_rx) = mpsc::channel(DEALT_QUEUE);
        let (done_tx, done) = oneshot::channel();
        let (abort, aborted) = oneshot::channel::<()>();
        let router = make_router.clone();
        let tls = tls.clone();
        let stop = stop.clone();
        // A thread that has already ended drops `done_tx` with the work: `finished`
        // reports it.
        serving.push(ServingLane {
            done: Some(done),
            abort: Some(abort),
        });
        dealt.push(deal_tx);
        Box::new(
            move || -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>> {
                Box::pin(async move {
                    let server = router().serve_with_incoming_shutdown(
                        incoming_dealt(deal_rx, tls, close_after),
                        stopped(stop),
                    );
                    let result = tokio::select! {
                        result = server => result,
                        _ = aborted => Ok(()),
                    };
                    let _ = done_tx.send(result);
                })
            },
        ) as Work
    });
    let dealer = tokio::spawn(deal(listener, dealt, stop.clone()));
    Serving {
        lanes: serving,
        dealer,
    }
}

impl Serving {
    /// Completes when every lane has stopped serving (after `stop`, once its
    /// connections have finished), with the first lane's error if any.
    pub(crate) async fn finished(&mut self) -> Result<(), tonic::transport::Error> {
        let mut first_error = Ok(());
        for lane in &mut self.lanes {
            if let Some(done) = lane.done.take() {
                match done.await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => {
                        if first_error.is_ok() {
                            first_error = Err(error);
                        }
                    }
                    Err(_) => tracing::error!("a gRPC serving thread ended without stopping"),
                }
            }
        }
        first_error
    }
}

impl Drop for Serving {
    /// Stops accepting and makes every lane close its remaining connections; each
    /// thread then ends on its own.
    fn drop(&mut self) {
        self.dealer.abort();
        for lane in &mut self.lanes {
            lane.abort.take();
        }
    }
}

/// Accepts until `stop` and deals each connection to the next lane. A lane that has
/// stopped taking connections leaves the rotation; with none left, accepting ends.
async fn deal(
    listener: TcpListener,
    mut lanes: Vec<mpsc::Sender<std::net::TcpStream>>,
    stop: watch::Receiver<bool>,
) {
    let mut next = 0usize;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stopped(stop.clone()) => return,
        };
        let mut stream = match accepted.and_then(|(stream, _)| stream.into_std()) {
            Ok(stream) => stream,
            Err(error) => {
                tracing::warn!(%error, "gRPC accept failed");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        loop {
            if lanes.is_empty() {
                return;
            }
            let index = next % lanes.len();
            next = next.wrapping_add(1);
            match lanes[index].send(stream).await {
                Ok(()) => break,
                Err(mpsc::error::SendError(back)) => {
                    tracing::error!("a gRPC serving thread stopped; dealing to the others");
                    lanes.swap_remove(index);
                    stream = back;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lanes::current;
    use crate::listener::hardened_server as grpc_server_builder;
    use crate::proto::core::HeaderValue;
    use crate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
    use crate::proto::rls::rate_limit_service_server::{RateLimitService, RateLimitServiceServer};
    use crate::proto::rls::{RateLimitRequest, RateLimitResponse};
    use tonic::{Request, Response, Status};

    /// Answers with the name of the thread that served the call.
    struct ThreadName;

    #[tonic::async_trait]
    impl RateLimitService for ThreadName {
        async fn should_rate_limit(
            &self,
            _: Request<RateLimitRequest>,
        ) -> Result<Response<RateLimitResponse>, Status> {
            let name = std::thread::current().name().unwrap_or("").to_owned();
            Ok(Response::new(RateLimitResponse {
                response_headers_to_add: vec![HeaderValue {
                    key: "thread".into(),
                    value: name,
                    ..HeaderValue::default()
                }],
                ..RateLimitResponse::default()
            }))
        }
    }

    async fn served_by(addr: std::net::SocketAddr) -> Result<String, String> {
        let mut client = RateLimitServiceClient::connect(format!("http://{addr}"))
            .await
            .map_err(|e| e.to_string())?;
        let response = client
            .should_rate_limit(RateLimitRequest::default())
            .await
            .map_err(|e| e.to_string())?;
        Ok(response.into_inner().response_headers_to_add[0]
            .value
            .clone())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_are_dealt_in_turn_and_stop_closes_the_listener() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop_tx, stop) = watch::channel(false);
        let make_router: MakeRouter =
            Arc::new(|| grpc_server_builder().add_service(RateLimitServiceServer::new(ThreadName)));
        let lanes = Lanes::spawn(2).expect("lanes");
        assert_eq!(current(), None, "not a serving thread");
        let handles = lanes.handles();
        assert_eq!(handles.len(), 2);
        let spawned = handles[1].spawn(async {
            let name = std::thread::current().name().map(str::to_owned);
            (name, current())
        });
        assert_eq!(
            spawned.await.expect("task ran"),
            (Some("sluice-grpc-1".to_owned()), Some(1)),
            "a task spawned through a lane's handle runs on that lane, before serving"
        );
        let mut lanes = serve(lanes, listener, None, None, &make_router, &stop);

        let mut threads = Vec::new();
        for _ in 0..4 {
            threads.push(served_by(addr).await.expect("served"));
        }
        assert_eq!(
            threads,
            [
                "sluice-grpc-0",
                "sluice-grpc-1",
                "sluice-grpc-0",
                "sluice-grpc-1"
            ],
            "one connection per call, dealt in turn"
        );

        stop_tx.send(true).expect("stop");
        tokio::time::timeout(std::time::Duration::from_secs(10), lanes.finished())
            .await
            .expect("lanes finish after stop")
            .expect("no serving error");
        let refused = tokio::time::timeout(std::time::Duration::from_secs(5), served_by(addr))
            .await
            .expect("an answer or a refusal, quickly");
        assert!(refused.is_err(), "listener closed after stop: {refused:?}");
    }
}
