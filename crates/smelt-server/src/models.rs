//! The served models: each one's id, tokenizer, chat template and scheduler. Models can be
//! loaded and unloaded while the server runs (`/admin/models`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use smelt_engine::{Engine, EngineOptions};
use smelt_tokenizer::{ChatTemplate, Tokenizer};

use crate::scheduler::{self, SchedulerConfig, SchedulerHandle};

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
    name.map(|n| n.to_string_lossy().into_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| reference.to_string())
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
        std::fs::remove_dir_all(&dir).unwrap();
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
    pub total_blocks: usize,
    pub scheduler: SchedulerHandle,
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
) -> Result<ModelEntry, String> {
    let loader = Arc::clone(loader);
    let r = reference.to_string();
    let started = scheduler::spawn(
        id.clone(),
        move || {
            let m = loader(&r)?;
            let template = ChatTemplate::from_gguf(m.engine.gguf().metadata(), &m.tokenizer)
                .map_err(|e| format!("the model's chat template: {e}"));
            let info = m.engine.info().clone();
            Ok((m.engine, Arc::new(m.tokenizer), (m.path, template, info)))
        },
        cfg,
    )?;
    let (path, template, info) = started.extra;
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
    Ok(ModelEntry {
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
        total_blocks: started.total_blocks,
        scheduler: started.handle,
    })
}
