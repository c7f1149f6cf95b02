//! What the CLIP text and vision towers read alike when detecting their config: the head
//! count and activation in `config.json`, the layer count and the projection width in the
//! weights (both towers use transformers' encoder and projection names).

use serde_json::Value;

use super::config::ClipActivation;
use crate::runner::{RunnerError, WeightBuilder};

/// `num_attention_heads` and `hidden_act` of one `config.json` section (`None` where absent).
/// An unknown `hidden_act` or a non-positive head count is an error, worded by `bad`: guessing
/// would give wrong outputs silently.
pub(crate) fn heads_and_act(
    section: &Value,
    bad: impl Fn(String) -> RunnerError,
) -> Result<(Option<usize>, Option<ClipActivation>), RunnerError> {
    let heads = match section.get("num_attention_heads") {
        Some(v) => Some(
            v.as_u64()
                .filter(|&h| h > 0)
                .ok_or_else(|| bad(format!("num_attention_heads {v} is not a positive integer")))?
                as usize,
        ),
        None => None,
    };
    let act = match section.get("hidden_act") {
        Some(v) => Some(
            v.as_str()
                .and_then(ClipActivation::from_hidden_act)
                .ok_or_else(|| bad(format!("hidden_act {v} is not quick_gelu or gelu")))?,
        ),
        None => None,
    };
    Ok((heads, act))
}

/// The number of consecutive `encoder.layers.{i}` under `tower` (each with its
/// `self_attn.out_proj.weight`); none at all is an error.
pub(crate) fn count_layers(
    tower: &WeightBuilder<'_, '_>,
    origin: &str,
) -> Result<usize, RunnerError> {
    let layers = (0..)
        .take_while(|i| tower.contains(&format!("encoder.layers.{i}.self_attn.out_proj.weight")))
        .count();
    if layers == 0 {
        return Err(RunnerError::MissingTensor {
            key: tower.key("encoder.layers.0.self_attn.out_proj.weight"),
            origin: origin.into(),
        });
    }
    Ok(layers)
}

/// The output width of the projection `name` ([hidden, proj], a `Linear` weight), `None` when
/// the file has none.
pub(crate) fn projection_dim(
    wb: &WeightBuilder<'_, '_>,
    name: &str,
    hidden: usize,
    origin: &str,
) -> Result<Option<usize>, RunnerError> {
    match wb.source_ne(name) {
        None => Ok(None),
        Some([p_in, proj, 1, 1]) if p_in == hidden && proj > 0 => Ok(Some(proj)),
        Some(ne) => Err(wb.bad_data(
            name,
            origin,
            format!("shape {ne:?} is not a [{hidden}, proj] projection"),
        )),
    }
}
