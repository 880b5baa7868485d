//! Recorded oracle answers: what a script printed and wrote, keyed by what it was given.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::Flavour;

/// Outputs up to this size are recorded whole (as text when UTF-8, else hex); larger ones by
/// length and SHA-256 (logits and activations: the tests compare them bit for bit, so the
/// digest is enough).
const WHOLE_LIMIT: usize = 256 * 1024;

/// One file the oracle wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    Whole(Vec<u8>),
    /// Only its length and SHA-256 were recorded.
    Digest {
        len: u64,
        sha256: String,
    },
}

impl Output {
    /// The bytes, unless only a digest was recorded.
    pub fn bytes(&self) -> Option<&[u8]> {
        match self {
            Output::Whole(b) => Some(b),
            Output::Digest { .. } => None,
        }
    }

    /// Little-endian f32s, unless only a digest was recorded.
    pub fn f32s(&self) -> Option<Vec<f32>> {
        self.bytes().map(|b| {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        })
    }

    /// Whether `ours` is byte for byte what the oracle wrote.
    pub fn matches(&self, ours: &[u8]) -> bool {
        match self {
            Output::Whole(b) => b == ours,
            Output::Digest { len, sha256 } => {
                *len == ours.len() as u64 && *sha256 == hex(&Sha256::digest(ours))
            }
        }
    }
}

/// An output as committed under `records/`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Stored {
    Text(String),
    Hex(String),
    Digest { len: u64, sha256: String },
}

/// Which outputs a record keeps whole (the rest by length and SHA-256).
#[derive(Clone, Copy, Debug)]
pub enum Keep<'a> {
    /// Every output up to 256 KiB.
    Small,
    /// Only these files (by name), whatever their size: for answers that are mostly data the
    /// test compares bit for bit (a dump of every tensor of a model's graph).
    Only(&'a [&'a str]),
}

impl Stored {
    fn of(name: &str, o: &Output, keep: Keep) -> Stored {
        let whole = match keep {
            Keep::Small => true,
            Keep::Only(names) => names.contains(&name),
        };
        match o {
            Output::Whole(b)
                if whole && (b.len() <= WHOLE_LIMIT || matches!(keep, Keep::Only(_))) =>
            {
                match std::str::from_utf8(b) {
                    Ok(s) => Stored::Text(s.to_owned()),
                    Err(_) => Stored::Hex(hex(b)),
                }
            }
            Output::Whole(b) => Stored::Digest {
                len: b.len() as u64,
                sha256: hex(&Sha256::digest(b)),
            },
            Output::Digest { len, sha256 } => Stored::Digest {
                len: *len,
                sha256: sha256.clone(),
            },
        }
    }
}

impl Stored {
    fn output(&self, record: &Path) -> Output {
        match self {
            Stored::Text(s) => Output::Whole(s.clone().into_bytes()),
            Stored::Hex(h) => Output::Whole(
                unhex(h).unwrap_or_else(|| panic!("oracle record {}: bad hex", record.display())),
            ),
            Stored::Digest { len, sha256 } => Output::Digest {
                len: *len,
                sha256: sha256.clone(),
            },
        }
    }
}

/// What one oracle run answered: exit code, stdout and the files it wrote, by file name.
#[derive(Clone, Debug)]
pub struct Answer {
    /// The script and its arguments, input files shown by name.
    pub call: String,
    pub code: Option<i32>,
    pub stdout: String,
    /// Only when the oracle ran here (not recorded).
    pub stderr: String,
    pub files: BTreeMap<String, Output>,
}

/// An answer as committed under `records/`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    call: String,
    code: Option<i32>,
    stdout: String,
    files: BTreeMap<String, Stored>,
}

impl Answer {
    /// A file the oracle wrote; panics (the test's failure) when it wrote none by that name.
    pub fn file(&self, name: &str) -> &Output {
        self.files.get(name).unwrap_or_else(|| {
            panic!(
                "the oracle ({}) wrote no {name}; it wrote {:?}",
                self.call,
                self.files.keys().collect::<Vec<_>>()
            )
        })
    }

    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    fn record(&self, keep: Keep) -> Record {
        Record {
            call: self.call.clone(),
            code: self.code,
            stdout: self.stdout.clone(),
            files: self
                .files
                .iter()
                .map(|(k, v)| (k.clone(), Stored::of(k, v, keep)))
                .collect(),
        }
    }
}

/// How an argument enters the key and what the oracle leaves behind in it.
enum Arg {
    Text(String),
    /// An existing file: its content is the input.
    File(PathBuf),
    /// An existing directory: the files in it are inputs, new or changed ones outputs.
    Dir(PathBuf, BTreeMap<String, [u8; 32]>),
    /// A path in an existing directory that does not exist yet: an output.
    OutFile(PathBuf),
}

fn classify(arg: &str) -> Arg {
    let p = Path::new(arg);
    if arg.contains('/') {
        if p.is_file() {
            return Arg::File(p.to_path_buf());
        }
        if p.is_dir() {
            return Arg::Dir(p.to_path_buf(), dir_hashes(p));
        }
        if p.parent().is_some_and(Path::is_dir) && p.file_name().is_some() {
            return Arg::OutFile(p.to_path_buf());
        }
    }
    Arg::Text(arg.to_owned())
}

fn dir_hashes(dir: &Path) -> BTreeMap<String, [u8; 32]> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().is_file() {
            out.insert(
                e.file_name().to_string_lossy().into_owned(),
                file_hash(&e.path()),
            );
        }
    }
    out
}

/// SHA-256 of a file, remembered per (path, length, mtime): the real models are hundreds of MB
/// and every test of a binary hashes them again.
fn file_hash(path: &Path) -> [u8; 32] {
    type Key = (PathBuf, u64, Option<std::time::SystemTime>);
    static SEEN: OnceLock<Mutex<HashMap<Key, [u8; 32]>>> = OnceLock::new();
    let meta =
        std::fs::metadata(path).unwrap_or_else(|e| panic!("oracle input {}: {e}", path.display()));
    let key = (path.to_path_buf(), meta.len(), meta.modified().ok());
    let seen = SEEN.get_or_init(Default::default);
    if let Some(h) = seen.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return *h;
    }
    let mut f = std::fs::File::open(path)
        .unwrap_or_else(|e| panic!("oracle input {}: {e}", path.display()));
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .unwrap_or_else(|e| panic!("oracle input {}: {e}", path.display()));
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    let d: [u8; 32] = h.finalize().into();
    seen.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, d);
    d
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn records_dir() -> PathBuf {
    std::env::var_os("SMELT_ORACLE_RECORDS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/records")))
}

/// Whether answers are replayed: on a CPU without AVX-512, or when `SMELT_ORACLE_REPLAY=1`
/// asks for it (to check the records on a CPU that could run the oracle).
fn replaying() -> bool {
    Flavour::host() != Flavour::Avx512
        || std::env::var_os("SMELT_ORACLE_REPLAY").is_some_and(|v| v == "1")
}

/// Runs `script` (a Python file) with `args` in the oracle whose bits the CPU engine
/// reproduces, llama.cpp's AVX-512 build: live on a CPU that has AVX-512 (the answer must equal
/// the committed record; `SMELT_ORACLE_RECORD=1` writes it), replayed from the record on any
/// other. Arguments that are paths to files or directories enter the record's key by content,
/// so a changed model, prompt or script is a new key, and a missing record fails the test.
/// A replayed answer's text files are written back where the script wrote them.
/// `keep` says which outputs the record holds whole; a test reads the others through
/// [`Output::matches`].
pub fn run_recorded(script: &Path, args: &[&str], keep: Keep) -> Answer {
    let name = script
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let source =
        std::fs::read(script).unwrap_or_else(|e| panic!("oracle script {}: {e}", script.display()));
    let classified: Vec<Arg> = args.iter().map(|a| classify(a)).collect();
    let mut key = Sha256::new();
    key.update(name.as_bytes());
    key.update(Sha256::digest(&source));
    let mut shown = vec![name.clone()];
    for a in &classified {
        match a {
            Arg::Text(s) => {
                key.update(b"\0text\0");
                key.update(s.as_bytes());
                shown.push(s.clone());
            }
            Arg::File(p) => {
                key.update(b"\0file\0");
                key.update(file_hash(p));
                shown.push(format!("<{}>", base(p)));
            }
            Arg::Dir(_, files) => {
                key.update(b"\0dir\0");
                for (n, h) in files {
                    key.update(n.as_bytes());
                    key.update(h);
                }
                shown.push(format!("<dir of {}>", files.len()));
            }
            Arg::OutFile(p) => {
                key.update(b"\0out\0");
                key.update(base(p).as_bytes());
                shown.push(format!("<out {}>", base(p)));
            }
        }
    }
    let key = hex(&key.finalize()[..8]);
    let stem = name.trim_end_matches(".py");
    let path = records_dir().join(format!("{stem}-{key}.json"));
    let call = shown.join(" ");
    let recorded: Option<Record> = std::fs::read(&path).ok().map(|b| {
        serde_json::from_slice(&b)
            .unwrap_or_else(|e| panic!("oracle record {} is not valid: {e}", path.display()))
    });

    if replaying() {
        let Some(record) = recorded else {
            panic!(
                "no recorded oracle answer for `{call}` ({}): this CPU has no AVX-512, so \
                 llama.cpp's AVX-512 build (the bits the CPU engine reproduces) cannot run here. \
                 Record it on an AVX-512 host with SMELT_ORACLE_RECORD=1 (bench/engine/device_cpu.sh \
                 does it on the GPU machine's CPU) and commit crates/smelt-oracle/records/.",
                path.display()
            );
        };
        let answer = Answer {
            call: record.call.clone(),
            code: record.code,
            stdout: record.stdout.clone(),
            stderr: String::new(),
            files: record
                .files
                .iter()
                .map(|(k, v)| (k.clone(), v.output(&path)))
                .collect(),
        };
        eprintln!("oracle: replaying the AVX-512 build's recorded answer for `{call}`");
        for a in &classified {
            let (dir, only) = match a {
                Arg::Dir(d, _) => (d.as_path(), None),
                Arg::OutFile(p) => (p.parent().unwrap_or(Path::new(".")), Some(base(p))),
                _ => continue,
            };
            for (n, out) in &answer.files {
                if only.as_ref().is_some_and(|o| o != n) {
                    continue;
                }
                if let Output::Whole(b) = out {
                    std::fs::write(dir.join(n), b).unwrap_or_else(|e| {
                        panic!("writing the recorded {n} into {}: {e}", dir.display())
                    });
                }
            }
        }
        return answer;
    }

    let mut answer = run_live(script, args);
    answer.call = call.clone();
    for a in &classified {
        match a {
            Arg::Dir(d, before) => {
                for (n, h) in dir_hashes(d) {
                    if before.get(&n) != Some(&h) {
                        let bytes = std::fs::read(d.join(&n)).unwrap_or_default();
                        answer.files.insert(n, Output::Whole(bytes));
                    }
                }
            }
            Arg::OutFile(p) if p.is_file() => {
                let bytes = std::fs::read(p).unwrap_or_default();
                answer.files.insert(base(p), Output::Whole(bytes));
            }
            _ => {}
        }
    }
    let mine = answer.record(keep);
    if recorded.as_ref() != Some(&mine) {
        if std::env::var_os("SMELT_ORACLE_RECORD").is_some_and(|v| v == "1") {
            std::fs::create_dir_all(records_dir()).ok();
            let text = serde_json::to_string_pretty(&mine).expect("an answer serializes");
            std::fs::write(&path, text + "\n")
                .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
            eprintln!("oracle: recorded `{call}` in {}", path.display());
        } else {
            panic!(
                "{} for `{call}` ({}): set SMELT_ORACLE_RECORD=1 to write it, then commit \
                 crates/smelt-oracle/records/ so CPUs without AVX-512 can replay it\n{}",
                if recorded.is_some() {
                    "the oracle's answer differs from its record"
                } else {
                    "no recorded oracle answer"
                },
                path.display(),
                answer.stderr
            );
        }
    }
    answer
}

/// Runs `script` with `args` in this host's oracle, for answers that do not depend on
/// llama.cpp's build (quantizers, tokenizers, gguf-py, whether a file loads at all).
pub fn run_live(script: &Path, args: &[&str]) -> Answer {
    let out = Command::new(crate::python())
        .arg(script)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    Answer {
        call: std::iter::once(base(script))
            .chain(args.iter().map(|a| a.to_string()))
            .collect::<Vec<_>>()
            .join(" "),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        files: BTreeMap::new(),
    }
}

fn base(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_rejects_junk() {
        let b = [0u8, 1, 0x7f, 0x80, 0xff];
        assert_eq!(hex(&b), "00017f80ff");
        assert_eq!(unhex(&hex(&b)).as_deref(), Some(&b[..]));
        assert_eq!(unhex("0g"), None);
        assert_eq!(unhex("abc"), None);
    }

    #[test]
    fn outputs_are_stored_whole_or_by_digest() {
        let text = Output::Whole(b"{\"a\": 1}".to_vec());
        let small = |o| Stored::of("f", o, Keep::Small);
        assert_eq!(small(&text), Stored::Text("{\"a\": 1}".into()));
        let bin = Output::Whole(vec![0xff, 0xfe, 0, 1]);
        assert_eq!(small(&bin), Stored::Hex("fffe0001".into()));
        assert!(matches!(
            Stored::of("g", &bin, Keep::Only(&["f"])),
            Stored::Digest { len: 4, .. }
        ));
        assert_eq!(
            Stored::of("f", &bin, Keep::Only(&["f"])),
            Stored::Hex("fffe0001".into())
        );
        let big = Output::Whole(vec![7u8; WHOLE_LIMIT + 1]);
        let stored = small(&big);
        assert!(matches!(stored, Stored::Digest { len, .. } if len == WHOLE_LIMIT as u64 + 1));
        let back = stored.output(Path::new("r.json"));
        assert!(back.bytes().is_none());
        assert!(back.matches(&vec![7u8; WHOLE_LIMIT + 1]));
        assert!(!back.matches(&vec![7u8; WHOLE_LIMIT]));
        let mut one_off = vec![7u8; WHOLE_LIMIT + 1];
        one_off[12345] = 8;
        assert!(!back.matches(&one_off));
        for o in [&text, &bin] {
            assert_eq!(&small(o).output(Path::new("r.json")), o);
        }
    }

    #[test]
    fn records_serialize_as_committed() {
        let r = Record {
            call: "greedy.py <m.gguf> 4".into(),
            code: Some(0),
            stdout: "{}\n".into(),
            files: [("out.bin".to_string(), Stored::Hex("00ff".into()))].into(),
        };
        let j = serde_json::to_string(&r).unwrap();
        assert!(j.contains("\"hex\":\"00ff\""), "{j}");
        assert_eq!(serde_json::from_str::<Record>(&j).unwrap(), r);
    }

    #[test]
    fn arguments_enter_the_key_by_kind() {
        let dir = std::env::temp_dir().join(format!("smelt-oracle-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("in.bin");
        std::fs::write(&f, b"abc").unwrap();
        assert!(matches!(classify("12"), Arg::Text(_)));
        assert!(matches!(classify(f.to_str().unwrap()), Arg::File(_)));
        assert!(matches!(classify(dir.to_str().unwrap()), Arg::Dir(_, ref m) if m.len() == 1));
        let out = dir.join("out.gguf");
        assert!(matches!(classify(out.to_str().unwrap()), Arg::OutFile(_)));
        assert!(matches!(classify("/no/such/dir/x"), Arg::Text(_)));
        assert_eq!(file_hash(&f), <[u8; 32]>::from(Sha256::digest(b"abc")));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
