//! An independent implementation of the same model: candle's BERT, on the CPU, from the same
//! files. Only built with the `candle` feature; the correctness test and the benchmark compare
//! our embeddings and throughput with it.
//!
//! Why a feature and not a dev-dependency: examples get dev-dependencies too, and an optimised
//! build of candle-transformers takes minutes on two cores — the demo must not pay for it.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};

use crate::error::{MinilmError, Result};
use crate::tokenize::Batch;

fn err(e: impl std::fmt::Display) -> MinilmError {
    MinilmError::Backend(format!("candle: {e}"))
}

/// candle's `BertModel` with mean pooling and L2 normalisation, as sentence-transformers does.
///
/// ```no_run
/// let dir = minilm::find_model_dir(None)?;
/// let reference = minilm::reference::CandleBert::load(&dir)?;
/// let tok = minilm::Tokenizer::from_file(&dir.join("tokenizer.json"), 256)?;
/// let e = reference.embed(&tok.batch(&["hello world"])?)?;
/// assert_eq!(e[0].len(), 384);
/// # Ok::<(), minilm::MinilmError>(())
/// ```
pub struct CandleBert {
    model: BertModel,
    device: Device,
}

impl std::fmt::Debug for CandleBert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CandleBert").finish_non_exhaustive()
    }
}

impl CandleBert {
    /// Loads `config.json` and `model.safetensors` from `dir` (the file is read into memory,
    /// which keeps this reference free of `unsafe`).
    pub fn load(dir: &Path) -> Result<Self> {
        let cfg_path = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg_path).map_err(|source| MinilmError::Io {
            path: cfg_path.clone(),
            source,
        })?;
        let cfg: Config = serde_json::from_str(&text).map_err(|source| MinilmError::Config {
            path: cfg_path,
            source,
        })?;
        let st = dir.join("model.safetensors");
        let bytes = std::fs::read(&st).map_err(|source| MinilmError::Io { path: st, source })?;
        let device = Device::Cpu;
        let vb = VarBuilder::from_buffered_safetensors(bytes, DType::F32, &device).map_err(err)?;
        let model = BertModel::load(vb, &cfg).map_err(err)?;
        Ok(CandleBert { model, device })
    }

    /// Unit-length embeddings of the batch's sentences.
    pub fn embed(&self, batch: &Batch) -> Result<Vec<Vec<f32>>> {
        let (b, t) = (batch.n_batch(), batch.n_tokens);
        let u32s = |v: &[i32]| v.iter().map(|&x| x as u32).collect::<Vec<u32>>();
        let ids = Tensor::from_vec(u32s(&batch.ids), (b, t), &self.device).map_err(err)?;
        let types = Tensor::from_vec(u32s(&batch.type_ids), (b, t), &self.device).map_err(err)?;
        let mask = Tensor::from_vec(batch.attention_mask(), (b, t), &self.device).map_err(err)?;
        let states = self.model.forward(&ids, &types, Some(&mask)).map_err(err)?; // [b, t, h]
        let maskf = mask.to_dtype(DType::F32).map_err(err)?;
        let summed = states
            .broadcast_mul(&maskf.unsqueeze(2).map_err(err)?)
            .and_then(|x| x.sum(1))
            .map_err(err)?; // [b, h]
        let counts = maskf.sum_keepdim(1).map_err(err)?; // [b, 1]
        let mean = summed.broadcast_div(&counts).map_err(err)?;
        let norm = mean
            .sqr()
            .and_then(|x| x.sum_keepdim(1))
            .and_then(|x| x.sqrt())
            .map_err(err)?;
        let unit = mean.broadcast_div(&norm).map_err(err)?;
        unit.to_vec2::<f32>().map_err(err)
    }
}
