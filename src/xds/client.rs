//! The ADS stream: subscribe, load each response, ACK or NACK it, reconnect.

use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tonic::metadata::{MetadataKey, MetadataValue};

use super::resource::{rule_files, TYPE_URL};
use super::{connect, XdsSettings, XdsState};
use crate::jitter;
use crate::proto::core::Node;
use crate::proto::discovery::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use crate::proto::discovery::{DiscoveryRequest, DiscoveryResponse};
use crate::proto::google::rpc::Status;
use crate::rules::live::{LiveRules, ReloadOutcome};
use crate::rules::watch::ReloadObserver;

/// Largest response accepted: rules of many domains, each up to a rule file's size.
const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;
/// gRPC `INVALID_ARGUMENT`, the code of a NACK's error detail.
const INVALID_ARGUMENT: i32 = 3;

/// The xDS client of one `serve`.
pub(crate) struct XdsClient {
    /// Where and how to connect.
    settings: XdsSettings,
    /// The rules responses are loaded into.
    rules: Arc<LiveRules>,
    /// Told of every load, as the file watcher tells it (logs, metrics, readiness).
    observer: Arc<dyn ReloadObserver>,
    /// What happened, for `/status` and `/metrics`.
    state: Arc<XdsState>,
}

/// How a stream ended.
#[derive(Debug, thiserror::Error)]
enum StreamError {
    /// Could not connect.
    #[error(transparent)]
    Connect(#[from] connect::ConnectError),
    /// The stream failed.
    #[error("xDS stream: {0}")]
    Status(#[from] tonic::Status),
    /// The server closed the stream.
    #[error("the xDS server closed the stream")]
    Closed,
}

// === impl XdsClient ===

impl XdsClient {
    /// A client loading into `rules`, reporting loads to `observer` and its state to
    /// `state`.
    pub(crate) fn new(
        settings: XdsSettings,
        rules: Arc<LiveRules>,
        observer: Arc<dyn ReloadObserver>,
        state: Arc<XdsState>,
    ) -> Self {
        Self {
            settings,
            rules,
            observer,
            state,
        }
    }

    /// Streams until `stop` turns true: a stream that ends or fails is opened again
    /// after the back-off; the rules loaded so far keep serving meanwhile.
    pub(crate) async fn run(self, mut stop: watch::Receiver<bool>) {
        tracing::info!(server = %self.settings.server, node = %self.settings.node_id, "xDS: subscribing to rate limit configs");
        // Streams that ended or failed since the last response.
        let mut broken: u32 = 0;
        loop {
            let (error, answered) = tokio::select! {
                ended = self.stream() => ended,
                _ = stop.wait_for(|stopped| *stopped) => return,
            };
            self.state.disconnected(error.to_string());
            if answered {
                broken = 0;
            }
            let wait = match error {
                StreamError::Connect(_) => jitter::spread(self.settings.connect_retry, 0.5),
                _ => {
                    broken = broken.saturating_add(1);
                    self.settings.backoff.wait(broken - 1, jitter::unit())
                }
            };
            tracing::warn!(%error, retry_in = ?wait, "xDS: disconnected; the current rules keep serving");
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|stopped| *stopped) => return,
            }
        }
    }

    /// One stream, from connecting to its end: why it ended, and whether the server
    /// answered on it.
    async fn stream(&self) -> (StreamError, bool) {
        let mut answered = false;
        let error = match self.try_stream(&mut answered).await {
            Ok(()) => StreamError::Closed,
            Err(error) => error,
        };
        (error, answered)
    }

    async fn try_stream(&self, answered: &mut bool) -> Result<(), StreamError> {
        let channel = connect::channel(&self.settings.server, self.settings.tls.as_ref()).await?;
        let mut client = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(MAX_RESPONSE_BYTES);
        // The requests: the subscription now, then one ACK or NACK per response.
        let (requests, outgoing) = mpsc::channel::<DiscoveryRequest>(4);
        let subscribe = self.request(self.state.acked_version(), String::new(), None);
        requests
            .try_send(subscribe)
            .map_err(|_| StreamError::Closed)?;
        let outgoing = futures::stream::unfold(outgoing, |mut outgoing| async move {
            outgoing.recv().await.map(|request| (request, outgoing))
        });
        let mut call = tonic::Request::new(outgoing);
        for (name, value) in &self.settings.headers {
            if let (Ok(name), Ok(value)) = (
                MetadataKey::from_bytes(name.as_bytes()),
                MetadataValue::try_from(value.as_str()),
            ) {
                call.metadata_mut().insert(name, value);
            }
        }
        let mut responses = client.stream_aggregated_resources(call).await?.into_inner();
        self.state.connected();
        tracing::info!(server = %self.settings.server, "xDS: connected");
        while let Some(response) = responses.message().await? {
            *answered = true;
            let answer = self.answer(response).await;
            if requests.send(answer).await.is_err() {
                return Err(StreamError::Closed);
            }
        }
        Ok(())
    }

    /// Loads a response and returns its ACK, or its NACK with the reason.
    async fn answer(&self, response: DiscoveryResponse) -> DiscoveryRequest {
        let DiscoveryResponse {
            version_info,
            resources,
            type_url,
            nonce,
            ..
        } = response;
        let loaded = if type_url == TYPE_URL {
            self.load(resources).await
        } else {
            Err(format!(
                "unexpected type {type_url:?}, subscribed to {TYPE_URL}"
            ))
        };
        match loaded {
            Ok(()) => {
                tracing::info!(version = %version_info, "xDS: rules accepted");
                self.state.acked(&version_info);
                self.request(version_info, nonce, None)
            }
            Err(reason) => {
                tracing::error!(version = %version_info, %reason, "xDS: rules rejected; the previous rules keep serving");
                self.state.nacked(&version_info, &nonce, &reason);
                let error = Status {
                    code: INVALID_ARGUMENT,
                    message: reason,
                    details: Vec::new(),
                };
                self.request(self.state.acked_version(), nonce, Some(error))
            }
        }
    }

    /// Loads the resources as the whole rule set; the reason when they do not load.
    async fn load(&self, resources: Vec<prost_types::Any>) -> Result<(), String> {
        let files = rule_files(&resources).map_err(|error| error.to_string())?;
        let rules = self.rules.clone();
        // Compiling is CPU work: off the async workers.
        let outcome = tokio::task::spawn_blocking(move || rules.apply(files))
            .await
            .map_err(|error| format!("loading rules: {error}"))?;
        self.observer.reloaded(&outcome);
        match outcome {
            ReloadOutcome::Loaded(_) => Ok(()),
            // The same content as last time: accepted again, or rejected again.
            ReloadOutcome::Unchanged => {
                let errors = self.rules.last_report().errors;
                if errors.is_empty() {
                    Ok(())
                } else {
                    Err(join(
                        errors.into_iter().map(|error| error.message).collect(),
                    ))
                }
            }
            ReloadOutcome::Failed { errors, .. } => {
                Err(join(errors.iter().map(ToString::to_string).collect()))
            }
        }
    }

    /// A request for the rate limit configs.
    fn request(
        &self,
        version_info: String,
        response_nonce: String,
        error_detail: Option<Status>,
    ) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info,
            node: Some(self.node()),
            resource_names: Vec::new(),
            type_url: TYPE_URL.to_owned(),
            response_nonce,
            error_detail,
        }
    }

    /// This client, as the management server knows it.
    fn node(&self) -> Node {
        let fields = self
            .settings
            .node_metadata
            .iter()
            .map(|(key, value)| {
                let value = prost_types::Value {
                    kind: Some(prost_types::value::Kind::StringValue(value.clone())),
                };
                (key.clone(), value)
            })
            .collect();
        Node {
            id: self.settings.node_id.clone(),
            cluster: String::new(),
            metadata: (!self.settings.node_metadata.is_empty())
                .then_some(prost_types::Struct { fields }),
            user_agent_name: "sluice".to_owned(),
            user_agent_version_type: Some(
                crate::proto::core::node::UserAgentVersionType::UserAgentVersion(
                    env!("CARGO_PKG_VERSION").to_owned(),
                ),
            ),
        }
    }
}

/// Most errors one NACK reason lists.
const MAX_NACK_ERRORS: usize = 10;

/// Errors as one NACK reason.
fn join(errors: Vec<String>) -> String {
    let more = errors.len().saturating_sub(MAX_NACK_ERRORS);
    let mut reason = errors[..errors.len() - more].join("; ");
    if more > 0 {
        reason.push_str(&format!("; and {more} more"));
    }
    reason
}
