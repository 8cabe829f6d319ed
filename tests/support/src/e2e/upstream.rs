//! A stand-in API behind Envoy that the test can watch and steer: it notes when each
//! request arrives, can hold every request until the test releases it (so requests stay
//! in flight for as long as a test needs), and answers with the headers the request
//! asks for: a request header `x-echo-NAME: V` becomes the response header `NAME: V`
//! (an upstream reporting a cost, for example).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, HeaderName};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// Prefix of the request headers echoed into the response.
const ECHO: &str = "x-echo-";

/// The body of every answer.
pub const BODY: &str = "upstream ok\n";

/// A running stand-in API on a loopback port; stopped on drop.
pub struct Upstream {
    /// Its port (the one Envoy's upstream cluster points at).
    pub port: u16,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

/// What the handler and the test share.
struct Shared {
    /// Whether each request waits for a [`Upstream::release`] before it is answered.
    hold: bool,
    /// Arrival instant of every request, in order.
    arrivals: Mutex<Vec<Instant>>,
    /// One permit per held request allowed to finish; fair, so the oldest goes first.
    released: Semaphore,
}

impl Upstream {
    /// An upstream that answers every request at once.
    pub async fn start() -> Self {
        Self::spawn(false).await
    }

    /// An upstream that holds every request until [`Upstream::release`] lets it finish.
    pub async fn holding() -> Self {
        Self::spawn(true).await
    }

    async fn spawn(hold: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the upstream's port");
        let port = listener.local_addr().expect("upstream address").port();
        let shared = Arc::new(Shared {
            hold,
            arrivals: Mutex::new(Vec::new()),
            released: Semaphore::new(0),
        });
        let app = axum::Router::new()
            .fallback(answer)
            .with_state(Arc::clone(&shared));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { port, shared, task }
    }

    /// Requests that have arrived so far.
    pub fn arrived(&self) -> usize {
        self.arrivals().len()
    }

    /// Arrival instant of every request so far, in order.
    pub fn arrivals(&self) -> Vec<Instant> {
        self.shared.arrivals.lock().expect("arrivals").clone()
    }

    /// Waits until `count` requests have arrived; panics after `within`.
    pub async fn wait_for_arrivals(&self, count: usize, within: Duration) {
        let deadline = Instant::now() + within;
        while self.arrived() < count {
            assert!(
                Instant::now() < deadline,
                "{} of {count} requests reached the upstream within {within:?}",
                self.arrived()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Lets the `count` oldest held requests finish (and any later request, up to
    /// `count` in all, when fewer are held now).
    pub fn release(&self, count: usize) {
        self.shared.released.add_permits(count);
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Every request: noted, held if the upstream holds, answered 200 with its echoes.
async fn answer(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> (HeaderMap, &'static str) {
    shared
        .arrivals
        .lock()
        .expect("arrivals")
        .push(Instant::now());
    if shared.hold {
        if let Ok(permit) = shared.released.acquire().await {
            permit.forget();
        }
    }
    let mut echoed = HeaderMap::new();
    for (name, value) in &headers {
        if let Some(Ok(name)) = name
            .as_str()
            .strip_prefix(ECHO)
            .map(str::parse::<HeaderName>)
        {
            echoed.insert(name, value.clone());
        }
    }
    (echoed, BODY)
}
