//! Compile specs: the export-time options stored in the .pte next to the blob
//! (keys defined in partitioner_py/rustconv/compile_specs.py).

use rustconv_kernels::{Algorithm, Choice};

use crate::error::ConfigError;
use crate::host::{log, LogLevel};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileOptions {
    pub num_threads: Option<usize>,
    /// How each conv1d's algorithm is chosen at init.
    pub conv1d_algorithm: Choice,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            num_threads: None,
            conv1d_algorithm: Choice::Auto,
        }
    }
}

impl CompileOptions {
    pub fn apply(&mut self, key: &str, value: &[u8]) -> Result<(), ConfigError> {
        match key {
            "num_threads" => {
                let bytes: [u8; 4] = value.try_into().map_err(|_| ConfigError::SpecLength {
                    key: key.to_owned(),
                    len: value.len(),
                    expected: 4,
                })?;
                let n = u32::from_le_bytes(bytes);
                if n == 0 {
                    return Err(ConfigError::NumThreads {
                        got: 0,
                        max: crate::threads::max_threads(),
                    });
                }
                self.num_threads = Some(n as usize);
            }
            "conv1d_algorithm" => {
                let name = std::str::from_utf8(value).unwrap_or("");
                self.conv1d_algorithm = match name {
                    "auto" => Choice::Auto,
                    "measure" => Choice::Measure,
                    other => Choice::Force(
                        Algorithm::from_name(other)
                            .ok_or_else(|| ConfigError::Algorithm(other.to_owned()))?,
                    ),
                };
            }
            // Export-time only: the exporter already grouped the kernels.
            "fusion" => {}
            // Newer exporters may add keys; an older runtime keeps working.
            other => log(
                LogLevel::Info,
                &format!("ignoring unknown compile spec '{other}'"),
            ),
        }
        Ok(())
    }
}
