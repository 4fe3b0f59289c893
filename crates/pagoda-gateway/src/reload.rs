//! Hot reload: the config file is polled (every `server.reload_interval_ms`); when its content
//! changes it is parsed and validated, and only a valid config is applied (`Gateway::apply`).
//! An invalid one is logged with the reason, shown by `GET /admin/config`, and the old config
//! keeps serving.
//!
//! Polling content (not file-system events) is deliberate: it sees editors that replace the
//! file, ConfigMap symlink swaps in Kubernetes and network file systems alike, and costs one
//! small read per interval. Invariant: the same content is never applied twice.

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::config::GatewayConfig;
use crate::state::Gateway;

fn digest(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

/// Re-reads the config file now; `Err` carries the reason it was rejected.
pub fn reload_now(gw: &Gateway) -> Result<(), String> {
    let Some(path) = &gw.config_path else {
        return Err("the gateway was started without a config file".into());
    };
    match GatewayConfig::load(path) {
        Ok(config) => {
            gw.apply(config);
            Ok(())
        }
        Err(e) => {
            gw.reject(e.to_string());
            Err(e.to_string())
        }
    }
}

/// Watches the config file until the gateway is dropped.
pub fn spawn_watcher(gw: Arc<Gateway>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let Some(path) = gw.config_path.clone() else {
            return;
        };
        let mut last = std::fs::read_to_string(&path).ok().map(|t| digest(&t));
        loop {
            let interval = gw.config().server.reload_interval_ms.max(50);
            tokio::time::sleep(Duration::from_millis(interval)).await;
            if Arc::strong_count(&gw) == 1 {
                return; // the gateway is gone
            }
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue; // mid-replace or removed: keep the running config
            };
            let d = digest(&text);
            if last == Some(d) {
                continue;
            }
            last = Some(d);
            match GatewayConfig::parse(&text, &path.display().to_string()) {
                Ok(config) => gw.apply(config),
                Err(e) => gw.reject(e.to_string()),
            }
        }
    })
}
