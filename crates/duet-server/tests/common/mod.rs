//! Test harness: an in-process server on a free loopback port, stopped when
//! the handle is dropped.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use duet_server::{Config, Server, ServerState};
use tokio::sync::oneshot;

pub struct TestServer {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    pub async fn start(tweak: impl FnOnce(&mut Config)) -> TestServer {
        let mut config = Config {
            port: 0,
            data_dir: None,
            message_timeout: Duration::from_millis(800),
            shutdown_grace: Duration::from_secs(5),
            ..Config::default()
        };
        tweak(&mut config);
        let state = ServerState::new(duetdb::Engine::in_memory(), config);
        let server = Server::bind(state).await.expect("bind");
        let addr = server.local_addr().expect("addr");
        let (tx, rx) = oneshot::channel::<()>();
        let done = tokio::spawn(server.run(async move {
            let _ = rx.await;
        }));
        TestServer {
            addr,
            stop: Some(tx),
            done: Some(done),
        }
    }

    pub fn uri(&self) -> String {
        format!("mongodb://{}/?directConnection=true", self.addr)
    }

    /// Stop gracefully and wait for the server to return.
    pub async fn shutdown(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(done) = self.done.take() {
            done.await.expect("join").expect("server run");
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}
