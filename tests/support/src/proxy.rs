//! A bad network on loopback: a TCP proxy between Sluice and Redis that adds latency,
//! jitter and a bandwidth limit, can swallow every byte silently (a half-open link:
//! the sockets stay open, nothing comes back) and can reset every connection. It runs
//! on a thread of its own, so that the test's and Sluice's runtimes do not slow it.
//!
//! Faults apply to every connection, open or new, from the moment they are set; each
//! direction is a loop that reads a chunk, waits as the faults say, then writes it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the link does to the bytes it carries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// Added to every chunk, each way.
    pub latency: Duration,
    /// Up to this much more, uniformly at random, per chunk.
    pub jitter: Duration,
    /// Bytes per second each way; 0 for no limit.
    pub bandwidth: u64,
    /// Read and drop every byte, each way, answering nothing (the connections stay
    /// open: neither side sees an error).
    pub blackhole: bool,
}

/// A running proxy to one upstream address; stops when dropped.
pub struct Proxy {
    /// Where Sluice connects.
    pub addr: SocketAddr,
    /// The faults now.
    faults: Arc<Mutex<Faults>>,
    /// Bumped to reset every open connection.
    resets: watch::Sender<u64>,
    /// Dropped to stop the proxy's thread.
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Proxy {
    /// A clean link from a free loopback port to `upstream`.
    pub fn start(upstream: SocketAddr) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("proxy addr");
        let faults = Arc::new(Mutex::new(Faults::default()));
        let (resets, _) = watch::channel(0);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shared = (faults.clone(), resets.clone());
        std::thread::Builder::new()
            .name("fault-proxy".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("proxy runtime");
                runtime.block_on(async move {
                    let listener = TcpListener::from_std(listener).expect("proxy listener");
                    tokio::select! {
                        _ = accept(listener, upstream, shared.0, shared.1) => {}
                        _ = stopped => {}
                    }
                });
            })
            .expect("proxy thread");
        Self {
            addr,
            faults,
            resets,
            _stop: stop,
        }
    }

    /// A `redis://` URL through the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Sets the faults of every connection, open or new.
    pub fn set(&self, faults: Faults) {
        *self.faults.lock().unwrap_or_else(|e| e.into_inner()) = faults;
    }

    /// A clean link again.
    pub fn clean(&self) {
        self.set(Faults::default());
    }

    /// Resets every open connection (an RST each way); new ones are accepted as before.
    pub fn reset(&self) {
        self.resets.send_modify(|resets| *resets += 1);
    }
}

async fn accept(
    listener: TcpListener,
    upstream: SocketAddr,
    faults: Arc<Mutex<Faults>>,
    resets: watch::Sender<u64>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let faults = faults.clone();
        let mut reset = resets.subscribe();
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            // Linger 0: a socket dropped sends an RST instead of a FIN, so that a
            // reset (the pumps aborted) is a reset on both sides.
            for socket in [&client, &server] {
                let _ = socket.set_nodelay(true);
                let _ = socket.set_zero_linger();
            }
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            let mut up = tokio::spawn(pump(client_read, server_write, faults.clone()));
            let mut down = tokio::spawn(pump(server_read, client_write, faults));
            tokio::select! {
                _ = reset.changed() => {}
                _ = &mut up => {}
                _ = &mut down => {}
            }
            up.abort();
            down.abort();
        });
    }
}

/// Copies `from` to `to` through the faults until either side closes.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    faults: Arc<Mutex<Faults>>,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    let mut seed = jitter_seed();
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        let now = *faults.lock().unwrap_or_else(|e| e.into_inner());
        if now.blackhole {
            continue;
        }
        let mut wait = now.latency;
        if !now.jitter.is_zero() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            wait += now.jitter.mul_f64((seed % 1000) as f64 / 1000.0);
        }
        if now.bandwidth > 0 {
            wait += Duration::from_secs_f64(read as f64 / now.bandwidth as f64);
        }
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}

/// A random seed for the jitter of one direction of one connection (never 0, the
/// xorshift's fixed point).
fn jitter_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
        | 1
}
