//! A TCP proxy in front of the API server that a scenario can cut: every connection
//! through it closed and new ones refused, until it is restored (replica `c` of the ctl
//! script reaches the API server only through it).

use std::sync::Mutex;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

pub struct CuttableProxy {
    listen: u16,
    upstream: u16,
    running: Mutex<Option<JoinHandle<()>>>,
}

impl CuttableProxy {
    /// Listens on 127.0.0.1:`listen`, forwarding to 127.0.0.1:`upstream`.
    pub async fn start(listen: u16, upstream: u16) -> Self {
        let proxy = CuttableProxy {
            listen,
            upstream,
            running: Mutex::new(None),
        };
        proxy.restore().await;
        proxy
    }

    /// Closes every connection and stops listening (new connections are refused).
    pub fn cut(&self) {
        if let Some(task) = self.running.lock().unwrap().take() {
            // The accept loop owns the connections' tasks: they go with it.
            task.abort();
        }
    }

    /// Listens again.
    pub async fn restore(&self) {
        let listener = TcpListener::bind(("127.0.0.1", self.listen))
            .await
            .unwrap_or_else(|e| panic!("the proxy cannot listen on {}: {e}", self.listen));
        let upstream = self.upstream;
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((mut client, _)) = listener.accept().await {
                connections.spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream)).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                while connections.try_join_next().is_some() {}
            }
        });
        *self.running.lock().unwrap() = Some(task);
    }
}

impl Drop for CuttableProxy {
    fn drop(&mut self) {
        self.cut();
    }
}

/// The API server's cuttable proxy and replica `c` behind it (stopped when dropped).
pub async fn replica_c_behind_proxy() -> (CuttableProxy, super::ReplicaC) {
    let port = |name: &str| -> u16 { std::env::var(name).unwrap().parse().unwrap() };
    let proxy = CuttableProxy::start(
        port("GPU_ADMISSION_E2E_PROXY_PORT"),
        port("GPU_ADMISSION_E2E_API_PORT"),
    )
    .await;
    (proxy, super::ReplicaC::start(false).await)
}
