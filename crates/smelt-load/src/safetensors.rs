//! Safetensors checkpoints, single-file or sharded (`model.safetensors.index.json`), mapped
//! read-only: a tensor's bytes are borrowed from its shard's map when it is converted.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use smelt_gguf::GgmlType;

use crate::LoadError;

/// One tensor of the checkpoint: where its bytes are, and what they are.
#[derive(Clone, Debug)]
pub struct StTensor {
    pub name: String,
    /// The safetensors dtype name (`BF16`, `F16`, `F32`, `I64` ...).
    pub dtype: String,
    /// PyTorch order: the contiguous dimension last.
    pub shape: Vec<u64>,
    shard: usize,
    start: usize,
    end: usize,
}

impl StTensor {
    /// The GGML type of the bytes, for the dtypes a weight can be loaded from.
    pub fn ggml_type(&self) -> Result<GgmlType, LoadError> {
        match self.dtype.as_str() {
            "F32" => Ok(GgmlType::F32),
            "F16" => Ok(GgmlType::F16),
            "BF16" => Ok(GgmlType::BF16),
            other => Err(LoadError::UnsupportedDtype {
                name: self.name.clone(),
                dtype: other.into(),
            }),
        }
    }
}

struct Shard {
    path: PathBuf,
    /// For large parallel reads (a mapping faults its pages in a few at a time).
    file: std::fs::File,
    map: memmap2::Mmap,
    data_start: usize,
}

/// Every tensor of a checkpoint, in file order then name order (as convert reads them).
pub struct Checkpoint {
    shards: Vec<Shard>,
    tensors: Vec<StTensor>,
    index: HashMap<String, usize>,
}

const SINGLE: &str = "model.safetensors";
const INDEX: &str = "model.safetensors.index.json";

impl Checkpoint {
    /// Opens `dir/model.safetensors`, or every shard `dir/model.safetensors.index.json`
    /// names (each checked to hold the tensors the index puts in it).
    pub fn open(dir: &Path) -> Result<Self, LoadError> {
        let index_path = dir.join(INDEX);
        let single = dir.join(SINGLE);
        let (files, weight_map) = if index_path.is_file() {
            let text =
                std::fs::read_to_string(&index_path).map_err(|e| LoadError::io(&index_path, e))?;
            let json: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| LoadError::bad_file(&index_path, format!("not JSON: {e}")))?;
            let Some(map) = json.get("weight_map").and_then(|m| m.as_object()) else {
                return Err(LoadError::bad_file(&index_path, "no \"weight_map\" object"));
            };
            let mut weight_map = BTreeMap::new();
            for (name, file) in map {
                let Some(file) = file.as_str() else {
                    return Err(LoadError::bad_file(
                        &index_path,
                        format!("weight_map[{name:?}] is not a file name"),
                    ));
                };
                if file.contains('/') || file.contains('\\') || file.starts_with('.') {
                    return Err(LoadError::bad_file(
                        &index_path,
                        format!("weight_map[{name:?}] = {file:?} is not a file of this folder"),
                    ));
                }
                weight_map.insert(name.clone(), file.to_string());
            }
            let mut files: Vec<String> = weight_map.values().cloned().collect();
            files.sort();
            files.dedup();
            (files, Some(weight_map))
        } else if single.is_file() {
            (vec![SINGLE.to_string()], None)
        } else {
            return Err(LoadError::Missing {
                path: single,
                what: "model.safetensors or model.safetensors.index.json with its shards",
            });
        };

        let mut shards = Vec::with_capacity(files.len());
        let mut tensors = Vec::new();
        for (i, file) in files.iter().enumerate() {
            let path = dir.join(file);
            if !path.is_file() {
                return Err(LoadError::Missing {
                    path,
                    what: "every shard model.safetensors.index.json names",
                });
            }
            let f = std::fs::File::open(&path).map_err(|e| LoadError::io(&path, e))?;
            // SAFETY: a read-only private map; the checkpoint must not change while it is
            // converted (the usual mmap contract, as for GGUF files).
            #[allow(unsafe_code)]
            let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| LoadError::io(&path, e))?;
            let (header, meta) = safetensors::SafeTensors::read_metadata(&map)
                .map_err(|e| LoadError::bad_file(&path, format!("not a safetensors file: {e}")))?;
            let data_start = 8 + header;
            let data_len = map.len().saturating_sub(data_start);
            let mut names: Vec<(String, &safetensors::tensor::TensorInfo)> =
                meta.tensors().into_iter().collect();
            names.sort_by(|a, b| a.0.cmp(&b.0));
            for (name, info) in names {
                let (start, end) = info.data_offsets;
                if start > end || end > data_len {
                    return Err(LoadError::bad_file(
                        &path,
                        format!("tensor {name}: bytes {start}..{end} outside the file"),
                    ));
                }
                tensors.push(StTensor {
                    name,
                    dtype: format!("{:?}", info.dtype),
                    shape: info.shape.iter().map(|&d| d as u64).collect(),
                    shard: i,
                    start,
                    end,
                });
            }
            shards.push(Shard {
                path,
                file: f,
                map,
                data_start,
            });
        }
        let mut index = HashMap::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            if index.insert(t.name.clone(), i).is_some() {
                return Err(LoadError::bad_file(
                    &shards[t.shard].path,
                    format!("tensor {} is in more than one shard", t.name),
                ));
            }
        }
        if let Some(wm) = weight_map {
            for (name, file) in &wm {
                match index.get(name) {
                    Some(&i) if files[tensors[i].shard] == *file => {}
                    _ => {
                        return Err(LoadError::bad_file(
                            dir.join(file),
                            format!("lacks tensor {name}, which {INDEX} puts there"),
                        ))
                    }
                }
            }
        }
        Ok(Self {
            shards,
            tensors,
            index,
        })
    }

    pub fn tensors(&self) -> &[StTensor] {
        &self.tensors
    }

    pub fn get(&self, name: &str) -> Option<&StTensor> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor's bytes, borrowed from its shard's map.
    pub fn bytes(&self, t: &StTensor) -> &[u8] {
        let s = &self.shards[t.shard];
        &s.map[s.data_start + t.start..s.data_start + t.end]
    }

    /// Bytes `offset..offset + buf.len()` of the tensor into `buf`, by parallel positioned
    /// reads of its shard (the pipelined quantizer's reads of a folder).
    pub fn read_at(&self, t: &StTensor, offset: u64, buf: &mut [u8]) -> Result<(), LoadError> {
        let s = &self.shards[t.shard];
        let len = (t.end - t.start) as u64;
        if offset + buf.len() as u64 > len {
            return Err(LoadError::BadTensor {
                name: t.name.clone(),
                why: format!("bytes {offset}..+{} past its {len} bytes", buf.len()),
            });
        }
        crate::pipeline::pread_parallel(
            &s.file,
            (s.data_start + t.start) as u64 + offset,
            buf,
            crate::pipeline::read_threads(),
            crate::pipeline::READ_PIECE,
        )
        .map_err(|e| LoadError::io(&s.path, e))
    }
}
