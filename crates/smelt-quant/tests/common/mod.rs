//! Shared by smelt-quant's integration tests: the committed ggml reference files, the
//! Python oracles, deterministic random data, and failure reports that say exactly where a
//! byte went wrong. Each test crate uses a different subset, hence the `dead_code` allowance.
#![allow(dead_code)]

pub mod dot_cases;

use smelt_quant::GgmlType;
use std::fmt::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every type smelt quantizes, in ggml id order.
pub const QUANTIZABLE: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
    GgmlType::BF16,
];

/// Every type smelt dequantizes and dots: the quantizable ones plus the IQ4 pair.
pub const DEQUANTIZABLE: [GgmlType; 17] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::BF16,
];

/// Byte offsets of the f16 scale fields in a block (ggml-common.h); a block whose scale
/// fields are finite is valid whatever its other bytes. Q8_K's scale is an f32 at 0.
pub fn f16_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q8_1 => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::IQ4_NL | GgmlType::IQ4_XS => &[0],
        _ => &[],
    }
}

pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn repo_root() -> PathBuf {
    crate_dir().join("../..")
}

/// Where `ggml_refs.py write` put the committed reference data.
pub fn ref_dir() -> PathBuf {
    crate_dir().join("tests/ggml")
}

/// One named input row of a reference set.
pub struct Row {
    pub case: String,
    pub values: Vec<f32>,
}

/// ggml's output for one input row.
pub struct RefRow {
    pub quant: Vec<u8>,
    pub dequant: Vec<f32>,
}

/// Everything `ggml_refs.py` recorded for one type.
pub struct TypeRefs {
    pub ty: GgmlType,
    pub inputs: Vec<Row>,
    /// ggml's quantization and dequantization of each input row; empty for types ggml
    /// (and smelt) only dequantize.
    pub rows: Vec<RefRow>,
    /// Random valid blocks and ggml's dequantization of them.
    pub random_blocks: Vec<u8>,
    pub random_dequant: Vec<f32>,
}

/// A cursor over a little-endian reference file that names the file in every complaint.
struct Reader<'a> {
    path: &'a Path,
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len());
        let Some(end) = end else {
            panic!(
                "{}: truncated at byte {} (wanted {n} more)",
                self.path.display(),
                self.pos
            )
        };
        let s = &self.data[self.pos..end];
        self.pos = end;
        s
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take(2).try_into().unwrap())
    }
    fn u32(&mut self) -> usize {
        u32::from_le_bytes(self.take(4).try_into().unwrap()) as usize
    }
    fn str(&mut self) -> String {
        let n = self.u16() as usize;
        String::from_utf8_lossy(self.take(n)).into_owned()
    }
    fn f32s(&mut self, n: usize) -> Vec<f32> {
        self.take(4 * n)
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
    fn magic(&mut self, want: &[u8]) {
        let got = self.take(want.len());
        assert_eq!(
            got,
            want,
            "{}: not a smelt reference file",
            self.path.display()
        );
    }
    fn finish(&self) {
        assert_eq!(
            self.pos,
            self.data.len(),
            "{}: trailing bytes",
            self.path.display()
        );
    }
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e} (regenerate with scripts/oracle/ggml_refs.py write)",
            path.display()
        )
    })
}

/// The rows of input set `name` (`b32` or `b256`).
pub fn load_inputs(name: &str) -> Vec<Row> {
    let path = ref_dir().join(format!("inputs_{name}.bin"));
    let data = read(&path);
    let mut r = Reader {
        path: &path,
        data: &data,
        pos: 0,
    };
    r.magic(b"SMQIN\0\0\x01");
    let rows = r.u32();
    let out = (0..rows)
        .map(|_| {
            let case = r.str();
            let n = r.u32();
            Row {
                case,
                values: r.f32s(n),
            }
        })
        .collect();
    r.finish();
    out
}

/// The committed ggml reference data of `ty`.
pub fn load_refs(ty: GgmlType) -> TypeRefs {
    let path = ref_dir().join(format!("{}.bin", ty.name().to_ascii_lowercase()));
    let data = read(&path);
    let mut r = Reader {
        path: &path,
        data: &data,
        pos: 0,
    };
    r.magic(b"SMQREF\0\x01");
    let (id, block, size) = (r.u32(), r.u32(), r.u32());
    assert_eq!(
        (id, block, size),
        (ty.id() as usize, ty.block_size(), ty.type_size()),
        "{}: header is for another type",
        path.display()
    );
    let set = r.str();
    let inputs = load_inputs(&set);
    let nrows = r.u32();
    assert!(
        nrows == 0 || nrows == inputs.len(),
        "{}: {nrows} rows for {} inputs",
        path.display(),
        inputs.len()
    );
    let rows = inputs[..nrows]
        .iter()
        .map(|row| {
            let n = row.values.len();
            RefRow {
                quant: r.take(n / block * size).to_vec(),
                dequant: r.f32s(n),
            }
        })
        .collect();
    let nb = r.u32();
    let random_blocks = r.take(nb * size).to_vec();
    let random_dequant = r.f32s(nb * block);
    r.finish();
    TypeRefs {
        ty,
        inputs,
        rows,
        random_blocks,
        random_dequant,
    }
}

/// Runs `f`, turning a panic (a `todo!()` stub, an index out of bounds) into its message so
/// a test can report it as one failure among others instead of dying on it.
pub fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|e| {
        if let Some(s) = e.downcast_ref::<&str>() {
            format!("panicked: {s}")
        } else if let Some(s) = e.downcast_ref::<String>() {
            format!("panicked: {s}")
        } else {
            "panicked".to_string()
        }
    })
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Floats with their bit patterns, so a 1-ulp difference is visible.
pub fn floats(values: &[f32]) -> String {
    let parts: Vec<String> = values
        .iter()
        .map(|v| format!("{v:e}({:08x})", v.to_bits()))
        .collect();
    parts.join(" ")
}

/// Failures of one test, grouped by stage, shown in full for the first few of each stage.
pub struct Report {
    title: String,
    stages: Vec<(String, usize, Vec<String>)>,
}

/// Detailed failures shown per stage; the rest are counted.
const SHOWN: usize = 4;

impl Report {
    pub fn new(title: impl Into<String>) -> Self {
        Report {
            title: title.into(),
            stages: Vec::new(),
        }
    }

    /// Notes that `stage` ran (so the summary lists it even when it passes).
    pub fn stage(&mut self, stage: &str) {
        if !self.stages.iter().any(|(s, _, _)| s == stage) {
            self.stages.push((stage.to_string(), 0, Vec::new()));
        }
    }

    pub fn fail(&mut self, stage: &str, detail: impl FnOnce() -> String) {
        self.stage(stage);
        let entry = self.stages.iter_mut().find(|(s, _, _)| s == stage).unwrap();
        entry.1 += 1;
        if entry.2.len() < SHOWN {
            entry.2.push(detail());
        }
    }

    pub fn failures(&self, stage: &str) -> usize {
        self.stages
            .iter()
            .find(|(s, _, _)| s == stage)
            .map_or(0, |e| e.1)
    }

    /// Prints a line per stage and panics if any failed.
    pub fn finish(self) {
        let mut text = String::new();
        let mut failed = false;
        for (stage, n, details) in &self.stages {
            let _ = writeln!(
                text,
                "{}: {stage}: {}",
                self.title,
                if *n == 0 {
                    "ok".to_string()
                } else {
                    format!("{n} FAILED")
                }
            );
            for d in details {
                let _ = writeln!(text, "    {}", d.replace('\n', "\n    "));
            }
            if *n > SHOWN {
                let _ = writeln!(text, "    ... and {} more", n - SHOWN);
            }
            failed |= *n > 0;
        }
        if !failed {
            eprint!("{text}");
        }
        assert!(!failed, "\n{text}");
    }
}

/// splitmix64: a tiny seeded generator, so tests need no RNG crate state to agree on.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1), 24 random bits.
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// Standard normal (Box-Muller; exactness is not needed where this is used).
    pub fn normal(&mut self) -> f32 {
        let u1 = ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }
    /// A random finite f16 (any exponent, either sign), as its bits.
    pub fn f16_bits(&mut self) -> u16 {
        let b = self.next_u64() as u16;
        if b & 0x7C00 == 0x7C00 {
            b & 0xBFFF
        } else {
            b
        }
    }
}

/// A seed for tests on fresh random data: `SMELT_SEED` when set (to replay a failure),
/// else the clock. Printed either way.
pub fn fresh_seed(test: &str) -> u64 {
    let seed = match std::env::var("SMELT_SEED") {
        Ok(s) => s
            .parse()
            .unwrap_or_else(|_| panic!("SMELT_SEED={s} is not a u64")),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    };
    eprintln!("{test}: seed {seed} (replay with SMELT_SEED={seed})");
    seed
}

/// Random bytes for `blocks` blocks of `ty` with every scale finite: valid blocks that
/// exercise every bit of the quant fields.
pub fn random_valid_blocks(ty: GgmlType, blocks: usize, rng: &mut Rng) -> Vec<u8> {
    let size = ty.type_size();
    let mut out: Vec<u8> = (0..blocks * size).map(|_| rng.next_u64() as u8).collect();
    for block in out.chunks_exact_mut(size) {
        match ty {
            GgmlType::F32 => {
                let mut bits = rng.next_u64() as u32;
                if bits & 0x7F80_0000 == 0x7F80_0000 {
                    bits &= 0xBFFF_FFFF;
                }
                block.copy_from_slice(&bits.to_le_bytes());
            }
            GgmlType::F16 => block.copy_from_slice(&rng.f16_bits().to_le_bytes()),
            GgmlType::BF16 => {
                let mut bits = rng.next_u64() as u16;
                if bits & 0x7F80 == 0x7F80 {
                    bits &= 0xBFFF;
                }
                block.copy_from_slice(&bits.to_le_bytes());
            }
            GgmlType::Q8_K => {
                let d = half::f16::from_bits(rng.f16_bits()).to_f32();
                block[..4].copy_from_slice(&d.to_le_bytes());
            }
            _ => {
                for &off in f16_fields(ty) {
                    block[off..off + 2].copy_from_slice(&rng.f16_bits().to_le_bytes());
                }
            }
        }
    }
    out
}

/// The oracle's Python, shared by every crate's tests (`smelt_oracle::python`).
pub fn python() -> PathBuf {
    smelt_oracle::python()
}

/// Runs an oracle script under `scripts/oracle/`; returns (exit code, stdout + stderr).
pub fn run_oracle(script: &str, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(python())
        .arg(repo_root().join("scripts/oracle").join(script))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {script}: {e} (run scripts/oracles.sh)"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// A scratch directory for one test, removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("smelt-quant-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    pub fn path(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn bytes_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
