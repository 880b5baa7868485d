//! Starting a model: loading it off the runtime's threads and putting it in the server's
//! set. Shared by the models named at startup and by `/admin/models`, which checks a load
//! first and then comes here.

use std::sync::Arc;
use std::time::Instant;

use super::LOG_TARGET;
use crate::error::ApiError;
use crate::models::{self, ModelEntry};
use crate::AppState;

/// Loads a model on its own scheduler thread and starts serving it.
pub(crate) async fn load_model(
    st: &Arc<AppState>,
    reference: &str,
    id: Option<String>,
) -> Result<Arc<ModelEntry>, ApiError> {
    load_inner(st, reference, reference, id).await
}

/// Loads `target` (what `reference` resolved to), serving it under `id` or the reference's
/// default id.
pub(super) async fn load_inner(
    st: &Arc<AppState>,
    target: &str,
    reference: &str,
    id: Option<String>,
) -> Result<Arc<ModelEntry>, ApiError> {
    let id = id.unwrap_or_else(|| models::model_id(reference));
    if st.models.get(Some(&id)).is_some() {
        return Err(ApiError {
            code: Some("model_exists"),
            ..ApiError::invalid_param("id", format!("a model with id `{id}` is already loaded"))
        });
    }
    let (loader, r, ctx, cfg, tmpl, prefix) = (
        Arc::clone(&st.loader),
        target.to_string(),
        st.config.ctx,
        st.config.scheduler,
        st.config.chat_template.clone(),
        st.config.prefix_cache,
    );
    let id2 = id.clone();
    let t0 = Instant::now();
    let entry =
        tokio::task::spawn_blocking(move || models::load(&loader, &r, id2, ctx, cfg, tmpl, prefix))
            .await
            .map_err(|e| ApiError::internal(format!("the loading task failed: {e}")))?
            .map_err(|e| ApiError::invalid_param("model", e))?;
    let e = st.models.insert(entry).map_err(ApiError::bad_request)?;
    tracing::info!(
        target: LOG_TARGET,
        model = %e.id,
        path = %e.path.display(),
        seconds = t0.elapsed().as_secs_f64(),
        "loaded"
    );
    Ok(e)
}
