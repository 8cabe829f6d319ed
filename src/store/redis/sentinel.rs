//! Following a Sentinel-managed primary.
//!
//! fred's Sentinel client asks the sentinels where the primary is only when its
//! connection breaks. A primary that hangs (`DEBUG SLEEP`, a stalled disk, a paused VM)
//! keeps its connections open: the sentinels promote its replica, and fred goes on
//! sending every call to the hung primary, where the charges land when it wakes, just
//! before it is demoted and resynchronised (they are lost), while the new primary gets
//! none.
//!
//! So Sluice follows the sentinels itself. Each store backend's nodes hold one
//! client aimed at the primary's address, and one task per backend ([`follow`]):
//! subscribes to `+switch-master` on a sentinel and acts on the notice at once; asks
//! `SENTINEL get-master-addr-by-name` at start, every [`POLL_EVERY`], and when a call
//! fails (`Nodes::suspect`), so that a notice sent while no subscription was up is
//! not missed; moves to the next sentinel when one does not answer. A new primary gets
//! a new client, connected before it takes calls, and a breaker of its own (nodes are
//! named by address); the old client is closed.

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use fred::prelude::{Client, ClientLike, Config, EventInterface, PubsubInterface, Server};
use fred::types::{ClusterHash, CustomCommand, Value};
use tokio::sync::Notify;

use super::client::{self, RedisOptions};

/// Longest time between two questions to the sentinels when no notice comes.
pub(crate) const POLL_EVERY: Duration = Duration::from_secs(1);

/// Shortest time between two questions (a failing call asks for one).
const POLL_GAP: Duration = Duration::from_millis(50);

/// Deadline of one question to a sentinel, and of a new primary's first connection.
const ASK_TIMEOUT: Duration = Duration::from_millis(500);

/// The channel on which sentinels announce a new primary:
/// `<service> <old ip> <old port> <new ip> <new port>`.
const SWITCH_MASTER: &str = "+switch-master";

/// What the task needs of the store's configuration.
pub(crate) struct Watch {
    /// The sentinels, in the order the URL names them.
    pub(crate) sentinels: Vec<Server>,
    /// The primary's name at the sentinels.
    pub(crate) service: String,
    /// Credentials and TLS of the URL, for the sentinels (as fred does without its
    /// `sentinel-auth` feature: the same as the primary's).
    pub(crate) config: Config,
    /// Timeouts and the rest.
    pub(crate) options: RedisOptions,
}

/// What follows the primary: the store's nodes (`super::nodes`, above this module).
pub(crate) trait Primary: Send + Sync + 'static {
    /// The sentinels name `server` as the primary; `how` says how Sluice learned it.
    fn follow_primary(&self, server: Server, how: &'static str) -> impl Future<Output = ()> + Send;
}

/// Keeps `nodes` on the primary the sentinels name, until the store is dropped.
pub(crate) async fn follow<P: Primary>(nodes: Weak<P>, watch: Watch, wake: Arc<Notify>) {
    if watch.sentinels.is_empty() {
        return;
    }
    let mut turn = 0;
    loop {
        let sentinel = watch.sentinels[turn % watch.sentinels.len()].clone();
        turn += 1;
        let Some(Session { asker, subscriber }) = Session::open(&watch, &sentinel).await else {
            if nodes.strong_count() == 0 {
                return;
            }
            tokio::time::sleep(POLL_GAP).await;
            continue;
        };
        let outcome = watch_one(&nodes, &watch, &asker, &subscriber, &wake).await;
        let _ = tokio::join!(quit(asker), quit(subscriber));
        if outcome == Outcome::StoreGone {
            return;
        }
        tracing::warn!(sentinel = %sentinel, "redis sentinel does not answer: asking the next");
    }
}

/// Why [`watch_one`] returned.
#[derive(PartialEq, Eq)]
enum Outcome {
    /// The store was dropped.
    StoreGone,
    /// The sentinel stopped answering.
    SentinelLost,
}

/// Follows the primary through one sentinel until it stops answering.
async fn watch_one<P: Primary>(
    nodes: &Weak<P>,
    watch: &Watch,
    asker: &Client,
    subscriber: &Client,
    wake: &Notify,
) -> Outcome {
    let mut notices = subscriber.message_rx();
    let mut reconnects = subscriber.reconnect_rx();
    loop {
        // Asked first, then after each wait: at start, after a subscription was (re)made
        // (a notice may have been missed), on a failing call, and every POLL_EVERY.
        let Some(primary) = ask(asker, &watch.service).await else {
            return Outcome::SentinelLost;
        };
        let Some(strong) = nodes.upgrade() else {
            return Outcome::StoreGone;
        };
        if let Some(primary) = primary {
            strong.follow_primary(primary, "asked").await;
        }
        drop(strong);
        tokio::time::sleep(POLL_GAP).await;
        tokio::select! {
            notice = notices.recv() => {
                let Ok(notice) = notice else { continue };
                let Some(primary) = switched(&notice.value, &watch.service) else {
                    continue;
                };
                let Some(strong) = nodes.upgrade() else {
                    return Outcome::StoreGone;
                };
                strong.follow_primary(primary, "+switch-master").await;
            }
            _ = reconnects.recv() => {
                if subscriber.subscribe(SWITCH_MASTER).await.is_err() {
                    return Outcome::SentinelLost;
                }
            }
            () = wake.notified() => {}
            () = tokio::time::sleep(POLL_EVERY) => {}
        }
    }
}

/// A sentinel's two connections: one asks, one listens (a subscribed RESP2
/// connection takes no other command).
struct Session {
    asker: Client,
    subscriber: Client,
}

impl Session {
    /// Both connections to `sentinel`, subscribed; `None` if it does not answer.
    async fn open(watch: &Watch, sentinel: &Server) -> Option<Self> {
        let mut config = client::node_config(&watch.config, sentinel.clone());
        // A sentinel has no databases.
        config.database = None;
        let asker = client::connect(config.clone(), &watch.options).ok()?;
        let subscriber = match client::connect(config, &watch.options) {
            Ok(subscriber) => subscriber,
            Err(_) => {
                quit(asker).await;
                return None;
            }
        };
        let ready = async {
            asker.wait_for_connect().await?;
            subscriber.wait_for_connect().await?;
            subscriber.subscribe(SWITCH_MASTER).await
        };
        match tokio::time::timeout(ASK_TIMEOUT, ready).await {
            Ok(Ok(())) => Some(Self { asker, subscriber }),
            _ => {
                let _ = tokio::join!(quit(asker), quit(subscriber));
                None
            }
        }
    }
}

/// The primary of `service` as the sentinel behind `asker` names it: `None` if it does
/// not answer, `Some(None)` if it knows no primary for that name.
async fn ask(asker: &Client, service: &str) -> Option<Option<Server>> {
    let command = CustomCommand::new_static("SENTINEL", ClusterHash::Random, false);
    let reply = tokio::time::timeout(
        ASK_TIMEOUT,
        asker.custom::<Value, _>(command, vec!["get-master-addr-by-name", service]),
    )
    .await
    .ok()?
    .ok()?;
    let address = match reply {
        Value::Array(parts) => match &parts[..] {
            [host, port] => host.as_string().zip(port.as_string()),
            _ => None,
        },
        _ => None,
    };
    Some(address.and_then(|(host, port)| Some(Server::new(host, port.parse().ok()?))))
}

/// The new primary a `+switch-master` notice names, if it is about `service`.
fn switched(notice: &Value, service: &str) -> Option<Server> {
    let text = notice.as_string()?;
    parse_switch(&text, service)
}

/// `<service> <old ip> <old port> <new ip> <new port>` → the new primary.
fn parse_switch(text: &str, service: &str) -> Option<Server> {
    match text.split_whitespace().collect::<Vec<_>>()[..] {
        [name, _, _, host, port] if name == service => Some(Server::new(host, port.parse().ok()?)),
        _ => None,
    }
}

/// Closes `client` without waiting long for a server that does not answer.
async fn quit(client: Client) {
    let _ = tokio::time::timeout(ASK_TIMEOUT, client.quit()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_switch_master_notices() {
        let server = parse_switch("mymaster 127.0.0.1 6379 10.0.0.2 6380", "mymaster");
        assert_eq!(server, Some(Server::new("10.0.0.2", 6380)));
        // Another service's, or a malformed one, is not ours.
        assert_eq!(parse_switch("other 1 2 3 4", "mymaster"), None);
        assert_eq!(parse_switch("mymaster 1 2 3", "mymaster"), None);
        assert_eq!(parse_switch("mymaster 1 2 3 x", "mymaster"), None);
    }
}
