//! The gateway's TOML file (`smelt gateway --config FILE`): its own keys and polling
//! interval, the static `[[node]]` list and the `[[model]]` catalogue. Parsed strictly
//! (unknown keys are errors, so a typo does not silently change behaviour) and checked as a
//! whole: unique names, pins that name known nodes, URLs that are URLs.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

/// The whole file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub gateway: GatewaySection,
    #[serde(default, rename = "node")]
    pub nodes: Vec<NodeConfig>,
    #[serde(default, rename = "model")]
    pub models: Vec<ModelConfig>,
}

/// `[gateway]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GatewaySection {
    /// Clients' keys for `/v1/*`; empty: open.
    #[serde(default)]
    pub api_keys: Vec<String>,
    /// The key of the gateway's own `/admin/*` (and of node registration); absent: disabled.
    pub admin_key: Option<String>,
    /// How often nodes are polled, in milliseconds.
    #[serde(default = "default_health_ms")]
    pub health_interval_ms: u64,
    /// When set, `/metrics` needs it (or the admin key); absent: `/metrics` is open.
    pub metrics_key: Option<String>,
    /// Host names the gateway answers to besides the localhost names when bound to
    /// localhost (`*`: any); bound elsewhere, any host unless names are listed.
    #[serde(default)]
    pub allow_hosts: Vec<String>,
    /// Origins whose cross-origin browser requests are allowed (`*`: any); none by default.
    #[serde(default)]
    pub cors: Vec<String>,
    /// A request's headers must arrive within this long (also the keep-alive idle time).
    #[serde(default = "default_header_ms")]
    pub header_timeout_ms: u64,
    /// A request's whole body must arrive within this long of its headers.
    #[serde(default = "default_body_ms")]
    pub body_timeout_ms: u64,
    /// A response write that makes no progress for this long ends the connection.
    #[serde(default = "default_idle_ms")]
    pub idle_timeout_ms: u64,
    /// Client connections served at once (one more closes the oldest idle one).
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// A node that joined by itself (`smelt serve --gateway`) and stays down this long is
    /// forgotten (nodes of the config are kept, down or not).
    #[serde(default = "default_forget_ms")]
    pub forget_after_ms: u64,
}

fn default_forget_ms() -> u64 {
    300_000
}

fn default_header_ms() -> u64 {
    10_000
}

fn default_body_ms() -> u64 {
    30_000
}

fn default_idle_ms() -> u64 {
    60_000
}

fn default_max_connections() -> usize {
    4096
}

fn default_health_ms() -> u64 {
    1000
}

impl Default for GatewaySection {
    fn default() -> Self {
        GatewaySection {
            api_keys: Vec::new(),
            admin_key: None,
            health_interval_ms: default_health_ms(),
            metrics_key: None,
            allow_hosts: Vec::new(),
            cors: Vec::new(),
            header_timeout_ms: default_header_ms(),
            body_timeout_ms: default_body_ms(),
            idle_timeout_ms: default_idle_ms(),
            max_connections: default_max_connections(),
            forget_after_ms: default_forget_ms(),
        }
    }
}

/// `[[node]]`: a `smelt serve` the gateway sends requests to.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    pub name: String,
    pub url: String,
    /// Sent to the node's `/admin/*` (and `/v1/*`, which the admin key also opens); never
    /// shown to clients.
    pub admin_key: Option<String>,
    /// Room for models on this node; absent: what the node reports (`--max-models-memory`).
    pub memory_mb: Option<u64>,
}

/// `[[model]]`: a model clients may ask for.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The `model` clients ask for (and the id it is loaded under on a node).
    pub name: String,
    /// What the node's `/admin/models` load takes: a path or an alias.
    pub source: String,
    /// What it takes on a node; absent: what a node reports once it has loaded it (before
    /// that, when `source` is a GGUF file the gateway can see, the file's size plus its KV
    /// cache at `ctx` tokens, from the file's header).
    pub memory_mb: Option<u64>,
    /// The context its nodes serve it with (`smelt serve --ctx`), for that estimate.
    #[serde(default)]
    pub ctx: Option<u64>,
    /// Loaded at start on these nodes and never evicted from them.
    #[serde(default)]
    pub pinned_on: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Parse(String),
    #[error("{0}")]
    Invalid(String),
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Config::parse(&text).map_err(|e| match e {
            ConfigError::Parse(m) => ConfigError::Parse(format!("{}: {m}", path.display())),
            ConfigError::Invalid(m) => ConfigError::Invalid(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let c: Config = toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        c.check()?;
        Ok(c)
    }

    pub fn health_interval(&self) -> Duration {
        Duration::from_millis(self.gateway.health_interval_ms)
    }

    fn check(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.gateway.health_interval_ms == 0 {
            return bad("[gateway] health_interval_ms must be at least 1".into());
        }
        if self.gateway.api_keys.iter().any(|k| k.is_empty()) {
            return bad("[gateway] api_keys must not hold an empty key".into());
        }
        if self.gateway.admin_key.as_deref() == Some("") {
            return bad(
                "[gateway] admin_key must not be empty (leave it out to disable admin)".into(),
            );
        }
        if self.gateway.metrics_key.as_deref() == Some("") {
            return bad("[gateway] metrics_key must not be empty (leave it out for none)".into());
        }
        let g = &self.gateway;
        if [g.header_timeout_ms, g.body_timeout_ms, g.idle_timeout_ms].contains(&0)
            || g.max_connections == 0
        {
            return bad(
                "[gateway] header_timeout_ms, body_timeout_ms, idle_timeout_ms and \
                 max_connections must be at least 1"
                    .into(),
            );
        }
        let mut nodes = BTreeSet::new();
        for n in &self.nodes {
            check_name("node", &n.name)?;
            if !nodes.insert(n.name.as_str()) {
                return bad(format!("node `{}` is listed twice", n.name));
            }
            check_url(&n.url)
                .map_err(|e| ConfigError::Invalid(format!("node `{}`: {e}", n.name)))?;
            if n.memory_mb == Some(0) {
                return bad(format!("node `{}`: memory_mb must be above 0", n.name));
            }
        }
        let mut models = BTreeSet::new();
        for m in &self.models {
            check_name("model", &m.name)?;
            if !models.insert(m.name.as_str()) {
                return bad(format!("model `{}` is listed twice", m.name));
            }
            if m.source.trim().is_empty() {
                return bad(format!("model `{}`: source must not be empty", m.name));
            }
            for p in &m.pinned_on {
                if !nodes.contains(p.as_str()) {
                    return bad(format!(
                        "model `{}` is pinned on `{p}`, which is no [[node]] of this file",
                        m.name
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Names appear in URLs, metrics labels and node ids: letters, digits and `-_.:/` only.
pub fn check_name(what: &str, name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:/".contains(c));
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid(format!(
            "{what} name {name:?} must be 1 to 128 letters, digits or -_.:/"
        )))
    }
}

/// `http://host:port` (https too), with no path beyond `/`.
pub fn check_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("url {url:?} must start with http:// or https://"))?;
    let host = rest.trim_end_matches('/');
    if host.is_empty() || host.contains('/') || host.contains(char::is_whitespace) {
        return Err(format!(
            "url {url:?} must be scheme://host:port with no path"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ISSUE_EXAMPLE: &str = r#"
[gateway]
api_keys = ["k-user"]
admin_key = "k-admin"
health_interval_ms = 1000

[[node]]
name = "a"
url = "http://127.0.0.1:9001"
admin_key = "k-node"
memory_mb = 4096

[[model]]
name = "smollm2"
source = "smollm2-135m"
memory_mb = 300
pinned_on = ["a"]
"#;

    #[test]
    fn the_issue_example_parses() {
        let c = Config::parse(ISSUE_EXAMPLE).unwrap();
        assert_eq!(c.gateway.api_keys, ["k-user"]);
        assert_eq!(c.gateway.admin_key.as_deref(), Some("k-admin"));
        assert_eq!(c.health_interval(), Duration::from_secs(1));
        assert_eq!(c.nodes.len(), 1);
        assert_eq!(c.nodes[0].memory_mb, Some(4096));
        assert_eq!(c.nodes[0].admin_key.as_deref(), Some("k-node"));
        assert_eq!(c.models[0].source, "smollm2-135m");
        assert_eq!(c.models[0].pinned_on, ["a"]);
    }

    #[test]
    fn defaults_are_open_and_one_second() {
        let c = Config::parse("[[model]]\nname='m'\nsource='x.gguf'\n").unwrap();
        assert!(c.gateway.api_keys.is_empty());
        assert_eq!(c.gateway.admin_key, None);
        assert_eq!(c.gateway.health_interval_ms, 1000);
        assert!(c.nodes.is_empty());
        assert_eq!(c.models[0].memory_mb, None);
    }

    #[test]
    fn mistakes_are_named() {
        let cases = [
            ("[gateway]\nadmin_kee = 'x'\n", "admin_kee"),
            (
                "[[node]]\nname='a'\nurl='http://h:1'\n[[node]]\nname='a'\nurl='http://h:2'\n",
                "twice",
            ),
            ("[[node]]\nname='a'\nurl='h:1'\n", "http://"),
            ("[[node]]\nname='a'\nurl='http://h:1/v1'\n", "no path"),
            (
                "[[model]]\nname='m'\nsource='s'\npinned_on=['zz']\n",
                "`zz`",
            ),
            ("[[model]]\nname='m m'\nsource='s'\n", "letters"),
            ("[[model]]\nname='m'\nsource=''\n", "source"),
            ("[gateway]\nhealth_interval_ms = 0\n", "at least 1"),
            (
                "[[node]]\nname='a'\nurl='http://h:1'\nmemory_mb=0\n",
                "above 0",
            ),
        ];
        for (text, says) in cases {
            let e = Config::parse(text).expect_err(text).to_string();
            assert!(e.contains(says), "{text:?} -> {e}");
        }
    }
}
