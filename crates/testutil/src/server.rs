//! The one in-process test server: `tokenmill-server` over the real engine and the default
//! model, on an ephemeral loopback port, on a runtime thread of its own. Dropping it (or
//! [`TestServer::stop`]) signals shutdown, which drains in-flight requests, and joins it.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use tokenmill_engine::EngineConfig;
use tokenmill_server::{AppState, Loaded, ServerConfig, SharedState, TokenizerPool};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// The default model with its engine launched under `config`.
pub fn load_default_model(config: &EngineConfig) -> Loaded {
    tokenmill_server::load(&crate::model_path(), config).expect("loading the default model")
}

/// Runs `serve` on a listener bound to an ephemeral loopback port, on a runtime thread of
/// its own (2 workers); returns the port's address once bound, and the thread.
pub fn serve_on_ephemeral_port<F, Fut>(serve: F) -> (SocketAddr, JoinHandle<()>)
where
    F: FnOnce(TcpListener) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(listener.local_addr().unwrap()).unwrap();
            serve(listener).await;
        });
    });
    (addr_rx.recv().unwrap(), thread)
}

/// A server running on its own runtime thread.
pub struct TestServer {
    /// `http://127.0.0.1:PORT`
    pub base: String,
    pub state: SharedState,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl TestServer {
    /// The default model under `engine`, served with `config`.
    pub fn start(engine: EngineConfig, config: ServerConfig) -> TestServer {
        let loaded = load_default_model(&engine);
        let pool = TokenizerPool::new(loaded.tokenizer.clone(), config.tokenizer_workers);
        TestServer::start_with(AppState::new(config, loaded.engine, pool))
    }

    /// Serves a state the test built itself.
    pub fn start_with(state: AppState) -> TestServer {
        let state = Arc::new(state);
        let (tx, rx) = oneshot::channel::<()>();
        let st = state.clone();
        let (addr, thread) = serve_on_ephemeral_port(move |listener| async move {
            tokenmill_server::serve(listener, st, async {
                let _ = rx.await;
            })
            .await
            .unwrap();
        });
        TestServer {
            base: format!("http://{addr}"),
            state,
            shutdown: Some(tx),
            thread: Some(thread),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Signals shutdown (drain) and waits for the server to return.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop_inner();
    }
}
