//! The node side of `smelt serve --gateway URL --name NAME [--gateway-key K]`: the node
//! registers with a running gateway and repeats it as a heartbeat, so a gateway that
//! restarts (or a second one behind the same address) learns of the node again by itself.

use std::time::Duration;

use crate::nodes::Registration;

/// How often a node re-registers.
pub const HEARTBEAT: Duration = Duration::from_secs(2);

/// Registers `me` with the gateway at `gateway` every [`HEARTBEAT`], forever; logs when the
/// gateway starts or stops accepting it (not every beat).
pub async fn heartbeats(gateway: String, key: Option<String>, me: Registration) {
    let url = format!("{}/admin/nodes", gateway.trim_end_matches('/'));
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(3))
        .timeout(Duration::from_secs(10))
        .build()
        .expect("an HTTP client with no TLS always builds");
    let mut joined: Option<bool> = None;
    loop {
        let mut r = http.post(&url).json(&me);
        if let Some(k) = &key {
            r = r.bearer_auth(k);
        }
        let outcome = match r.send().await {
            Ok(resp) if resp.status().is_success() => Ok(()),
            Ok(resp) => {
                let status = resp.status();
                let v: serde_json::Value = resp.json().await.unwrap_or_default();
                Err(format!("{status}: {}", crate::nodes::error_text(&v)))
            }
            Err(e) => Err(e.to_string()),
        };
        match (&outcome, joined) {
            (Ok(()), Some(true)) => {}
            (Ok(()), _) => {
                tracing::info!(gateway = %gateway, name = %me.name, url = %me.url, "joined the gateway");
            }
            (Err(why), Some(true) | None) => {
                tracing::warn!(gateway = %gateway, "cannot register with the gateway (retrying): {why}");
            }
            (Err(_), Some(false)) => {}
        }
        joined = Some(outcome.is_ok());
        tokio::time::sleep(HEARTBEAT).await;
    }
}
