//! A real xDS management server for the tests: the aggregated discovery service (state
//! of the world) on a loopback port, optionally with mutual TLS, serving snapshots of
//! `RateLimitConfig` resources and recording every request (subscriptions, ACKs and
//! NACKs). It runs on a runtime of its own, so [`XdsServer::kill`] drops every
//! connection at once, as a crashed server would.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message;
use sluice::proto::discovery::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use sluice::proto::discovery::{DiscoveryRequest, DiscoveryResponse};
use sluice::proto::rls_config::RateLimitConfig;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_stream::{Stream, StreamExt};
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

/// PEM files of the server's mutual TLS.
pub struct ServerTls {
    /// Its certificate chain.
    pub cert_pem: String,
    /// Its key.
    pub key_pem: String,
    /// The CA client certificates must chain to.
    pub client_ca_pem: String,
}

/// One version of the rules, as the server sends it.
#[derive(Clone, Default)]
struct Snapshot {
    version: String,
    resources: Vec<prost_types::Any>,
}

/// What the streams share.
#[derive(Clone)]
struct Shared {
    snapshot: watch::Sender<Option<Snapshot>>,
    requests: Arc<Mutex<Vec<DiscoveryRequest>>>,
    nonce: Arc<Mutex<u64>>,
}

/// A running management server.
pub struct XdsServer {
    /// Where it listens.
    pub addr: SocketAddr,
    shared: Shared,
    runtime: Option<tokio::runtime::Runtime>,
}

impl XdsServer {
    /// Starts a server on a free loopback port.
    pub fn start(tls: Option<&ServerTls>) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        Self::start_on(listener, tls)
    }

    /// Starts a server on `addr` (a restart on the port a killed one had).
    pub fn restart_on(addr: SocketAddr, tls: Option<&ServerTls>) -> Self {
        let started = Instant::now();
        let listener = loop {
            match std::net::TcpListener::bind(addr) {
                Ok(listener) => break listener,
                Err(error) => {
                    assert!(
                        started.elapsed() < Duration::from_secs(5),
                        "bind {addr}: {error}"
                    );
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        };
        Self::start_on(listener, tls)
    }

    fn start_on(listener: std::net::TcpListener, tls: Option<&ServerTls>) -> Self {
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let shared = Shared {
            snapshot: watch::channel(None).0,
            requests: Arc::default(),
            nonce: Arc::default(),
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("xDS server runtime");
        let mut builder = Server::builder();
        if let Some(tls) = tls {
            let config = ServerTlsConfig::new()
                .identity(Identity::from_pem(&tls.cert_pem, &tls.key_pem))
                .client_ca_root(Certificate::from_pem(&tls.client_ca_pem));
            builder = builder.tls_config(config).expect("xDS server TLS");
        }
        let service = AggregatedDiscoveryServiceServer::new(Ads(shared.clone()));
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            let _ = builder
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await;
        });
        Self {
            addr,
            shared,
            runtime: Some(runtime),
        }
    }

    /// Makes `configs` the whole rule set at `version`, sent to every stream now and
    /// to every stream that subscribes later.
    pub fn push(&self, version: &str, configs: &[RateLimitConfig]) {
        let resources = configs
            .iter()
            .map(|config| prost_types::Any {
                type_url: sluice::xds::TYPE_URL.into(),
                value: config.encode_to_vec(),
            })
            .collect();
        self.push_any(version, resources);
    }

    /// Makes `resources` (of any type) the snapshot at `version`.
    pub fn push_any(&self, version: &str, resources: Vec<prost_types::Any>) {
        self.shared.snapshot.send_replace(Some(Snapshot {
            version: version.into(),
            resources,
        }));
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<DiscoveryRequest> {
        self.shared.requests.lock().expect("requests").clone()
    }

    /// Waits up to 5 s for a request that `matches`; returns it.
    pub async fn wait_for(
        &self,
        what: &str,
        matches: impl Fn(&DiscoveryRequest) -> bool,
    ) -> DiscoveryRequest {
        let started = Instant::now();
        loop {
            if let Some(found) = self.requests().into_iter().find(|request| matches(request)) {
                return found;
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "no {what} within 5 s; requests: {:#?}",
                self.requests()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stops at once, dropping every connection.
    pub fn kill(mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for XdsServer {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// The discovery service.
struct Ads(Shared);

type Responses = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = Responses;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Responses>, Status> {
        let mut incoming = request.into_inner();
        let shared = self.0.clone();
        let (out, responses) = mpsc::channel(16);
        tokio::spawn(async move {
            let mut snapshots = shared.snapshot.subscribe();
            let mut subscribed = false;
            loop {
                tokio::select! {
                    request = incoming.next() => {
                        let Some(Ok(request)) = request else { return };
                        shared.requests.lock().expect("requests").push(request);
                        if !subscribed {
                            subscribed = true;
                            snapshots.mark_changed();
                        }
                    }
                    changed = snapshots.changed(), if subscribed => {
                        if changed.is_err() { return; }
                        let Some(snapshot) = snapshots.borrow_and_update().clone() else { continue };
                        let nonce = {
                            let mut nonce = shared.nonce.lock().expect("nonce");
                            *nonce += 1;
                            nonce.to_string()
                        };
                        let response = DiscoveryResponse {
                            version_info: snapshot.version,
                            resources: snapshot.resources,
                            canary: false,
                            type_url: sluice::xds::TYPE_URL.into(),
                            nonce,
                        };
                        if out.send(Ok(response)).await.is_err() { return; }
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(responses))))
    }
}
