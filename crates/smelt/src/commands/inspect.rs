//! `smelt inspect`: what is in a GGUF file, for people (a table) or programs (`--json`).

use anyhow::{Context, Result};
use clap::Args;
use serde_json::{json, Map, Value as Json};
use smelt_gguf::{Array, GgmlType, Gguf, TensorInfo, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

use crate::fmt::{bytes, count, shape};

/// Arrays longer than this are summarised (type, length, first items): a tokenizer's
/// 262,144 tokens must not flood the terminal or the JSON.
const ARRAY_FULL_MAX: usize = 16;
/// Items shown from the start of a summarised array.
const ARRAY_HEAD: usize = 8;

/// `writeln!` into a `String`, which cannot fail.
macro_rules! line {
    ($o:expr, $($arg:tt)*) => {{
        let _ = writeln!($o, $($arg)*);
    }};
}

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// The model to read, as -m/--model takes it (a Hugging Face folder shows as the GGUF it
    /// converts to) [default: smollm2-135m]
    #[arg(value_name = "MODEL", conflicts_with = "model")]
    pub file: Option<String>,
    /// The same as MODEL, as every command takes it [default: smollm2-135m]
    #[arg(long, short = 'm', value_name = "MODEL")]
    pub model: Option<String>,
    /// Print one JSON object (version, alignment, metadata, tensors, totals) instead of tables.
    /// Long arrays become {"type", "len", "first"}.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &InspectArgs) -> Result<()> {
    let reference = args
        .file
        .as_deref()
        .or(args.model.as_deref())
        .unwrap_or(super::model_ref::DEFAULT_MODEL);
    let file: PathBuf = super::model_ref::resolve(reference)?;
    // A Hugging Face folder shows as the GGUF it converts to (smelt-load).
    let g = if file.is_dir() {
        super::isq::open(&file, None, smelt_engine::Device::Cpu)?
    } else {
        Gguf::open(&file)
            .with_context(|| format!("cannot read {} as a GGUF file", file.display()))?
    };
    let totals = Totals::of(g.tensors());
    let text = if args.json {
        let mut s = serde_json::to_string_pretty(&to_json(&g, &totals))?;
        s.push('\n');
        s
    } else {
        text(&file, &g, &totals)
    };
    // One write, so a closed pipe is one error the caller can recognise, not a panic.
    std::io::stdout().lock().write_all(text.as_bytes())?;
    Ok(())
}

/// Parameters and bytes over all tensors, and per type.
struct Totals {
    params: u64,
    bytes: u64,
    by_type: BTreeMap<GgmlType, (usize, u64, u64)>,
}

impl Totals {
    fn of(tensors: &[TensorInfo]) -> Totals {
        let mut t = Totals {
            params: 0,
            bytes: 0,
            by_type: BTreeMap::new(),
        };
        for info in tensors {
            let (n, b) = (info.n_elements(), info.n_bytes());
            t.params += n;
            t.bytes += b;
            let e = t.by_type.entry(info.ty).or_insert((0, 0, 0));
            e.0 += 1;
            e.1 += n;
            e.2 += b;
        }
        t
    }

    fn bits_per_weight(&self) -> f64 {
        bpw(self.bytes, self.params)
    }
}

fn bpw(bytes: u64, params: u64) -> f64 {
    if params == 0 {
        0.0
    } else {
        bytes as f64 * 8.0 / params as f64
    }
}

fn text(path: &std::path::Path, g: &Gguf, totals: &Totals) -> String {
    let mut o = String::new();
    line!(o, "{}", path.display());
    line!(
        o,
        "GGUF v{}, alignment {}, tensor data at byte {}",
        g.version(),
        g.alignment(),
        g.data_offset()
    );
    let md = g.metadata();
    line!(o, "\nmetadata ({} keys)", md.len());
    let key_w = md.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let ty_w = md
        .iter()
        .map(|(_, v)| v.type_name().len())
        .max()
        .unwrap_or(0);
    for (k, v) in md.iter() {
        line!(o, "  {k:key_w$}  {:ty_w$}  {}", v.type_name(), one_line(v));
    }

    let ts = g.tensors();
    line!(o, "\ntensors ({})", ts.len());
    let name_w = ts.iter().map(|t| t.name.len()).max().unwrap_or(4).max(4);
    let shape_w = ts
        .iter()
        .map(|t| shape(&t.shape).len())
        .max()
        .unwrap_or(5)
        .max(5);
    line!(
        o,
        "  {:name_w$}  {:7}  {:shape_w$}  {:>12}",
        "name",
        "type",
        "shape",
        "bytes"
    );
    for t in ts {
        line!(
            o,
            "  {:name_w$}  {:7}  {:shape_w$}  {:>12}",
            t.name,
            t.ty.name(),
            shape(&t.shape),
            count(t.n_bytes())
        );
    }

    line!(o, "\ntotals");
    line!(o, "  tensors     {}", ts.len());
    line!(o, "  parameters  {}", count(totals.params));
    line!(
        o,
        "  bytes       {} ({})",
        count(totals.bytes),
        bytes(totals.bytes)
    );
    line!(o, "  bits/weight {:.3}", totals.bits_per_weight());
    line!(o, "  by type");
    for (ty, (n, params, b)) in &totals.by_type {
        line!(
            o,
            "    {:7} {:>5} tensors  {:>15} params  {:>12}  {:.3} bits/weight",
            ty.name(),
            n,
            count(*params),
            bytes(*b),
            bpw(*b, *params)
        );
    }
    line!(o, "  shape: ggml order, row length first");
    o
}

/// The gguf crate's short display form, kept to one line: chat templates hold newlines.
fn one_line(v: &Value) -> String {
    let s = v.to_string();
    let s = s.replace('\n', "\\n");
    const MAX: usize = 120;
    if s.chars().count() > MAX {
        let cut: String = s.chars().take(MAX).collect();
        format!("{cut}... ({} chars)", s.chars().count())
    } else {
        s
    }
}

fn to_json(g: &Gguf, totals: &Totals) -> Json {
    let mut md = Map::new();
    for (k, v) in g.metadata().iter() {
        md.insert(k.to_string(), value_json(v));
    }
    let tensors: Vec<Json> = g
        .tensors()
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "type": t.ty.name(),
                "shape": t.shape,
                "offset": t.offset,
                "bytes": t.n_bytes(),
            })
        })
        .collect();
    let mut by_type = Map::new();
    for (ty, (n, params, b)) in &totals.by_type {
        by_type.insert(
            ty.name().to_string(),
            json!({ "tensors": n, "parameters": params, "bytes": b, "bits_per_weight": bpw(*b, *params) }),
        );
    }
    json!({
        "version": g.version(),
        "alignment": g.alignment(),
        "data_offset": g.data_offset(),
        "metadata": md,
        "tensors": tensors,
        "totals": {
            "tensors": g.tensors().len(),
            "parameters": totals.params,
            "bytes": totals.bytes,
            "bits_per_weight": totals.bits_per_weight(),
            "by_type": by_type,
        },
    })
}

fn value_json(v: &Value) -> Json {
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F32(x) => float_json(f64::from(*x)),
        Value::F64(x) => float_json(*x),
        Value::Bool(x) => json!(x),
        Value::String(s) => json!(s),
        Value::Array(a) => array_json(a, v.type_name()),
    }
}

/// JSON has no NaN or infinity; those become strings rather than failing the whole dump.
fn float_json(x: f64) -> Json {
    serde_json::Number::from_f64(x).map_or_else(|| json!(x.to_string()), Json::Number)
}

fn array_json(a: &Array, type_name: &str) -> Json {
    let len = a.len();
    let take = if len > ARRAY_FULL_MAX {
        ARRAY_HEAD
    } else {
        len
    };
    let items = array_items(a, take);
    if len > ARRAY_FULL_MAX {
        json!({ "type": type_name, "len": len, "first": items })
    } else {
        Json::Array(items)
    }
}

fn array_items(a: &Array, take: usize) -> Vec<Json> {
    fn head<T: Clone, F: Fn(T) -> Json>(v: &[T], take: usize, f: F) -> Vec<Json> {
        v.iter().take(take).cloned().map(f).collect()
    }
    match a {
        Array::U8(v) => head(v, take, |x| json!(x)),
        Array::I8(v) => head(v, take, |x| json!(x)),
        Array::U16(v) => head(v, take, |x| json!(x)),
        Array::I16(v) => head(v, take, |x| json!(x)),
        Array::U32(v) => head(v, take, |x| json!(x)),
        Array::I32(v) => head(v, take, |x| json!(x)),
        Array::U64(v) => head(v, take, |x| json!(x)),
        Array::I64(v) => head(v, take, |x| json!(x)),
        Array::F32(v) => head(v, take, |x| float_json(f64::from(x))),
        Array::F64(v) => head(v, take, float_json),
        Array::Bool(v) => head(v, take, |x| json!(x)),
        Array::String(v) => head(v, take, |x| json!(x)),
        Array::Array(v) => v
            .iter()
            .take(take)
            .map(|inner| array_json(inner, "array"))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_arrays_are_summarised() {
        let a = Array::U32((0..1000).collect());
        let j = array_json(&a, "array[u32]");
        assert_eq!(j["len"], 1000);
        assert_eq!(j["first"].as_array().map(Vec::len), Some(ARRAY_HEAD));
        let short = array_json(
            &Array::String(vec!["a".into(), "b".into()]),
            "array[string]",
        );
        assert_eq!(short, json!(["a", "b"]));
    }

    #[test]
    fn non_finite_floats_do_not_break_json() {
        assert_eq!(float_json(f64::NAN), json!("NaN"));
        assert_eq!(float_json(1.5), json!(1.5));
    }
}
