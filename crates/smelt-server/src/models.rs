//! The served models: each one's id, tokenizer, chat template and scheduler. Models can be
//! loaded and unloaded while the server runs (`/admin/models`), from the places
//! [`Confinement`] allows, under ids [`check_id`] accepts.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use smelt_engine::{Engine, EngineOptions};
use smelt_tokenizer::{ChatTemplate, Tokenizer};

use crate::error::ApiError;
use crate::grammar::Grammars;
use crate::guard::clip;
use crate::scheduler::{self, SchedulerConfig, SchedulerHandle};
use crate::tools::ToolFormat;

/// Longest model id.
pub const MAX_ID_LEN: usize = 128;

/// An id a client chose: 1 to [`MAX_ID_LEN`] characters of letters, digits and `._-:/@+`.
pub fn check_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(format!(
            "a model id must have 1 to {MAX_ID_LEN} characters (this one has {})",
            id.chars().count()
        ));
    }
    if let Some(c) = id.chars().find(|&c| !id_char(c)) {
        return Err(format!(
            "a model id may hold letters, digits and `._-:/@+`, not {c:?}"
        ));
    }
    Ok(())
}

fn id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "._-:/@+".contains(c)
}

/// The id derived from a reference, made valid: other characters become `-`, and it is cut
/// to [`MAX_ID_LEN`].
fn sanitized_id(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| if id_char(c) { c } else { '-' })
        .take(MAX_ID_LEN)
        .collect();
    if s.is_empty() {
        "model".into()
    } else {
        s
    }
}

/// Where `/admin/models` may load from: the `--models-dir` folders (anything inside them,
/// symbolic links resolved), the built-in aliases, and the models the server started with.
#[derive(Debug, Default)]
pub struct Confinement {
    dirs: Vec<PathBuf>,
    /// References loadable as they are written (aliases, the start-up references).
    refs: Vec<String>,
    /// Start-up model files and folders, resolved.
    paths: Vec<PathBuf>,
}

impl Confinement {
    pub fn new(dirs: &[PathBuf], aliases: &[String], startup: &[String]) -> Confinement {
        Confinement {
            dirs: dirs.iter().filter_map(|d| d.canonicalize().ok()).collect(),
            refs: aliases.iter().chain(startup).cloned().collect(),
            paths: startup
                .iter()
                .filter_map(|r| Path::new(r).canonicalize().ok())
                .collect(),
        }
    }

    /// The reference to load, or why it may not be: 403 outside the allowed places, 404 for
    /// a name inside them that does not exist. Says nothing about files outside.
    pub fn check(&self, reference: &str) -> Result<String, ApiError> {
        if self.refs.iter().any(|r| r == reference) {
            return Ok(reference.to_string());
        }
        let outside = || {
            let mut e = ApiError::invalid_param(
                "model",
                format!(
                    "model `{}` is not loadable here: models load from the server's \
                     --models-dir folders and built-in aliases only",
                    clip(reference, 100)
                ),
            );
            e.status = axum::http::StatusCode::FORBIDDEN;
            e.kind = "permission_error";
            e.code = Some("model_path_forbidden");
            e
        };
        let missing = || ApiError {
            code: Some("model_not_found"),
            status: axum::http::StatusCode::NOT_FOUND,
            ..ApiError::invalid_param(
                "model",
                format!(
                    "there is no model `{}` in the --models-dir folders",
                    clip(reference, 100)
                ),
            )
        };
        if reference.is_empty() || reference.contains('\0') || reference.len() > 4096 {
            return Err(outside());
        }
        let path = Path::new(reference);
        let candidates: Vec<PathBuf> = if path.is_absolute() {
            vec![path.to_path_buf()]
        } else {
            self.dirs.iter().map(|d| d.join(path)).collect()
        };
        let mut inside_but_missing = false;
        for c in candidates {
            match c.canonicalize() {
                Ok(real) => {
                    if self.paths.contains(&real) || self.dirs.iter().any(|d| real.starts_with(d)) {
                        return Ok(real.to_string_lossy().into_owned());
                    }
                }
                Err(_) => {
                    // Missing: say so only when its name is plainly inside a folder.
                    let plain = !c
                        .components()
                        .any(|x| matches!(x, std::path::Component::ParentDir));
                    if plain && self.dirs.iter().any(|d| c.starts_with(d)) {
                        inside_but_missing = true;
                    }
                }
            }
        }
        Err(if inside_but_missing {
            missing()
        } else {
            outside()
        })
    }
}

/// A model as a loader hands it over.
pub struct LoadedModel {
    pub path: PathBuf,
    pub engine: Engine,
    pub tokenizer: Tokenizer,
}

/// Turns a `--model` value (a path, or an alias the caller knows) into a loaded model. It
/// runs on the model's own scheduler thread, so it may block for as long as loading takes.
pub type Loader = Arc<dyn Fn(&str) -> Result<LoadedModel, String> + Send + Sync>;

/// A loader for GGUF paths only (tests, embedding): no aliases, no fetching.
pub fn gguf_loader(opts: EngineOptions) -> Loader {
    Arc::new(move |reference: &str| {
        let path = PathBuf::from(reference);
        let engine = Engine::load(&path, &opts)
            .map_err(|e| format!("cannot load {}: {e}", path.display()))?;
        let tokenizer = Tokenizer::from_gguf(engine.gguf().metadata())
            .map_err(|e| format!("cannot build the tokenizer of {}: {e}", path.display()))?;
        Ok(LoadedModel {
            path,
            engine,
            tokenizer,
        })
    })
}

/// The id a model reference is served under: a file's stem (`SmolLM2-135M-Instruct.Q4_1`),
/// a folder's name (a Hugging Face checkout), or the reference itself for an alias
/// (`smollm2-135m`).
pub fn model_id(reference: &str) -> String {
    let p = Path::new(reference);
    let name = if p.is_file() {
        p.file_stem()
    } else if p.is_dir() {
        p.file_name()
    } else {
        None
    };
    let name = name
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| reference.to_string());
    sanitized_id(&name)
}

#[cfg(test)]
mod tests {
    use super::model_id;

    #[test]
    fn ids_are_stems_folder_names_or_aliases() {
        let dir = std::env::temp_dir().join(format!("smelt-id-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("My-Model")).unwrap();
        std::fs::write(dir.join("tiny.Q4_0.gguf"), b"").unwrap();
        let f = dir.join("tiny.Q4_0.gguf");
        assert_eq!(model_id(f.to_str().unwrap()), "tiny.Q4_0");
        let d = dir.join("My-Model");
        assert_eq!(model_id(d.to_str().unwrap()), "My-Model");
        assert_eq!(model_id("smollm2-135m"), "smollm2-135m");
        assert_eq!(model_id("a b\0c"), "a-b-c");
        assert_eq!(model_id(&"x".repeat(1000)).len(), super::MAX_ID_LEN);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn client_ids_are_checked() {
        use super::check_id;
        for ok in ["m", "org/model:q4_0", "a.b-c_d@1+2"] {
            assert!(check_id(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a\0b", "a b", "é", "<script>", &"x".repeat(129)] {
            assert!(check_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn confinement_keeps_loads_inside_the_folders() {
        use super::Confinement;
        let root = std::env::temp_dir().join(format!("smelt-confine-{}", std::process::id()));
        let dir = root.join("models");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("m.gguf"), b"").unwrap();
        std::fs::write(root.join("secret"), b"root:x").unwrap();
        let startup = root.join("start.gguf");
        std::fs::write(&startup, b"").unwrap();
        let c = Confinement::new(
            std::slice::from_ref(&dir),
            &["smollm2-135m".into()],
            &[startup.display().to_string()],
        );
        assert_eq!(c.check("smollm2-135m").unwrap(), "smollm2-135m");
        assert!(c.check("m.gguf").unwrap().ends_with("m.gguf"));
        assert!(c.check(dir.join("m.gguf").to_str().unwrap()).is_ok());
        assert!(c.check(startup.to_str().unwrap()).is_ok());
        let status = |r: &str| c.check(r).unwrap_err().status.as_u16();
        assert_eq!(status(root.join("secret").to_str().unwrap()), 403);
        assert_eq!(status("../secret"), 403);
        assert_eq!(status("/etc/passwd"), 403);
        assert_eq!(status("/no/such/file"), 403);
        assert_eq!(status("a\0b"), 403);
        assert_eq!(status("gone.gguf"), 404);
        assert_eq!(status("../gone.gguf"), 403);
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(root.join("secret"), dir.join("link")).unwrap();
            assert_eq!(status("link"), 403);
        }
        let e = c.check(root.join("secret").to_str().unwrap()).unwrap_err();
        assert!(!e.message.contains("root:x"), "{}", e.message);
        std::fs::remove_dir_all(&root).unwrap();
    }
}

/// One served model.
pub struct ModelEntry {
    pub id: String,
    pub reference: String,
    pub path: PathBuf,
    /// Unix seconds of loading (`created` in `/v1/models`).
    pub created: u64,
    pub tokenizer: Arc<Tokenizer>,
    /// The chat template, or why the model has no usable one.
    pub template: Result<ChatTemplate, String>,
    /// Most tokens one sequence may hold (prompt and generation).
    pub ctx: usize,
    pub arch: String,
    /// Width of the hidden state (of an embedding).
    pub n_embd: usize,
    /// What the GGUF says about pooling its hidden states into an embedding.
    pub pooling: smelt_engine::embed::FilePooling,
    pub total_blocks: usize,
    /// What the model takes in memory: its weights and its KV cache (an estimate).
    pub bytes: u64,
    pub scheduler: SchedulerHandle,
    /// Grammar compiler and cache for constrained decoding.
    pub grammars: Arc<Grammars>,
    /// How the chat template says this model writes tool calls (none: tools are refused).
    pub tool_format: Option<ToolFormat>,
    /// The template knows `<think>` blocks: their text answers as `reasoning_content`.
    pub think: bool,
}

/// The models being served, in loading order.
#[derive(Default)]
pub struct Registry {
    models: RwLock<Vec<Arc<ModelEntry>>>,
}

impl Registry {
    pub fn list(&self) -> Vec<Arc<ModelEntry>> {
        self.models
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The model `id`, or the first one when the request names none.
    pub fn get(&self, id: Option<&str>) -> Option<Arc<ModelEntry>> {
        let models = self.models.read().unwrap_or_else(|p| p.into_inner());
        match id {
            Some(id) => models.iter().find(|m| m.id == id).cloned(),
            None => models.first().cloned(),
        }
    }

    /// Adds a loaded model; fails if its id is taken.
    pub fn insert(&self, entry: ModelEntry) -> Result<Arc<ModelEntry>, String> {
        let mut models = self.models.write().unwrap_or_else(|p| p.into_inner());
        if models.iter().any(|m| m.id == entry.id) {
            return Err(format!("a model with id `{}` is already loaded", entry.id));
        }
        let e = Arc::new(entry);
        models.push(Arc::clone(&e));
        Ok(e)
    }

    /// Stops serving `id`. Its scheduler finishes the requests it has, then its thread ends
    /// and the weights are freed.
    pub fn remove(&self, id: &str) -> Option<Arc<ModelEntry>> {
        let mut models = self.models.write().unwrap_or_else(|p| p.into_inner());
        let i = models.iter().position(|m| m.id == id)?;
        Some(models.remove(i))
    }
}

/// Loads `reference` on a new scheduler thread and describes it. Blocks until the model is
/// loaded: call it from a blocking context.
pub fn load(
    loader: &Loader,
    reference: &str,
    id: String,
    ctx: usize,
    cfg: SchedulerConfig,
    chat_template: Option<String>,
    prefix_cache: bool,
) -> Result<ModelEntry, String> {
    let loader = Arc::clone(loader);
    let r = reference.to_string();
    let log_id = id.clone();
    let started = scheduler::spawn(
        id.clone(),
        move || {
            let mut m = loader(&r)?;
            m.engine.set_prefix_cache(prefix_cache);
            let cache_on = m.engine.prefix_cache_on();
            if prefix_cache && !cache_on {
                // Said once, at load: a user reading /metrics' zero hits should know why.
                tracing::warn!(
                    model = %log_id,
                    "no prefix caching for this model: its recurrent layers keep a state per \
                     sequence that cached KV blocks do not hold (every prompt is computed in full)"
                );
            }
            let template = match &chat_template {
                Some(spec) => ChatTemplate::from_spec(spec, &m.tokenizer)
                    .map_err(|e| format!("the --chat-template: {e}")),
                None => ChatTemplate::from_gguf(m.engine.gguf().metadata(), &m.tokenizer)
                    .map_err(|e| format!("the model's chat template: {e}")),
            };
            let info = m.engine.info().clone();
            let weights = m.engine.gguf().file_size();
            let pooling = smelt_engine::embed::file_pooling(m.engine.gguf());
            Ok((
                m.engine,
                Arc::new(m.tokenizer),
                (m.path, template, info, weights, pooling, cache_on),
            ))
        },
        cfg,
    )?;
    let (path, template, info, weights, pooling, cache_on) = started.extra;
    started
        .handle
        .stats
        .prefix_cache_enabled
        .store(u64::from(cache_on), std::sync::atomic::Ordering::Relaxed);
    // The KV cache as f32 keys and values, every layer, every block.
    let kv = (started.total_blocks * EngineOptions::default().block_size) as u64
        * info.n_layer as u64
        * (info.n_head_kv * (info.head_dim + info.head_dim_v)) as u64
        * 4;
    if let Err(e) = &template {
        tracing::warn!(model = %id, "no chat completions: {e}");
    }
    // The context is what the user asked for, within what the model was trained on.
    let ctx = if info.n_ctx_train > 0 {
        ctx.min(info.n_ctx_train)
    } else {
        ctx
    };
    // The thread lives as long as the scheduler; it is not joined.
    drop(started.join);
    let source = template
        .as_ref()
        .ok()
        .and_then(|t| t.jinja_source())
        .unwrap_or("");
    let (tool_format, think) = (ToolFormat::detect(source), source.contains("<think>"));
    Ok(ModelEntry {
        grammars: Arc::new(Grammars::new(Arc::clone(&started.tokenizer))),
        tool_format,
        think,
        id,
        reference: reference.to_string(),
        path,
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        tokenizer: started.tokenizer,
        template,
        ctx,
        arch: info.arch.name().to_string(),
        n_embd: info.n_embd,
        pooling,
        total_blocks: started.total_blocks,
        bytes: weights.saturating_add(kv),
        scheduler: started.handle,
    })
}
