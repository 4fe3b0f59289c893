//! Which device a model runs on: [`Device`] (the CPU, or NVIDIA GPU `N`) and
//! [`DeviceChoice`], what a user asks for with `--device auto|cpu|cuda[:N]`, resolved
//! against what this machine has.
//!
//! Invariants: `auto` never fails (no usable GPU means the CPU, with the reason kept for the
//! start-up report); `cuda` / `cuda:N` fails with an error naming what is missing (the
//! driver, NVRTC, cuBLAS, a GPU, that ordinal) and never falls back silently.

use crate::ModelError;
use std::fmt;
use std::str::FromStr;

/// Where a model's weights live and its forward pass runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Device {
    Cpu,
    /// NVIDIA GPU number `N` as the driver counts them (`cuda:N`).
    Cuda(usize),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// For tests that need a GPU (in this and the crates above): skip with a line, or fail under
/// CI, where the GPU tests run in the CUDA interpreter.
pub use pagoda_cuda::interpret::no_gpu_for_test;

/// Whether this machine lacks the NVIDIA driver (libcuda), i.e. has no NVIDIA GPU to use:
/// where the CPU is all there is, saying so on every load is noise unless a GPU was asked for.
pub fn nvidia_driver_missing() -> bool {
    matches!(
        pagoda_cuda::list_gpus(),
        Err(pagoda_cuda::CudaError::MissingLibraries(missing))
            if missing.contains(&pagoda_cuda::libraries::DRIVER)
    )
}

/// What `--device` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// A usable NVIDIA GPU (the first) when there is one, else the CPU.
    #[default]
    Auto,
    Cpu,
    /// `cuda` (`None`: the first GPU) or `cuda:N`.
    Cuda(Option<usize>),
    /// `cuda-interpret`: the CUDA path run on the CPU by the CUDA interpreter
    /// (`pagoda_cuda::interpret`), for checking it without a GPU. Never chosen by `auto`.
    CudaInterpret,
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceChoice::Auto => f.write_str("auto"),
            DeviceChoice::Cpu => f.write_str("cpu"),
            DeviceChoice::Cuda(None) => f.write_str("cuda"),
            DeviceChoice::Cuda(Some(n)) => write!(f, "cuda:{n}"),
            DeviceChoice::CudaInterpret => f.write_str("cuda-interpret"),
        }
    }
}

impl FromStr for DeviceChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "auto" => return Ok(DeviceChoice::Auto),
            "cpu" => return Ok(DeviceChoice::Cpu),
            "cuda" | "gpu" => return Ok(DeviceChoice::Cuda(None)),
            "cuda-interpret" => return Ok(DeviceChoice::CudaInterpret),
            _ => {}
        }
        if let Some(n) = s.strip_prefix("cuda:") {
            return n.parse().map(|n| DeviceChoice::Cuda(Some(n))).map_err(|_| {
                format!("`{s}`: the GPU number after cuda: must be a number, e.g. cuda:0")
            });
        }
        Err(format!(
            "unknown device `{s}`: use auto, cpu, cuda, cuda:N or cuda-interpret"
        ))
    }
}

/// A resolved choice: the device, and for `auto` on the CPU why no GPU was taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub device: Device,
    /// Why `auto` chose the CPU (no GPU, a missing library); `None` otherwise.
    pub cpu_because: Option<String>,
    /// The GPU's name and memory, for the start-up line.
    pub gpu: Option<pagoda_cuda::Gpu>,
}

impl DeviceChoice {
    /// The device this choice means on this machine (see the module's invariants).
    pub fn resolve(self) -> Result<Resolved, ModelError> {
        let cpu = |why: Option<String>| Resolved {
            device: Device::Cpu,
            cpu_because: why,
            gpu: None,
        };
        match self {
            DeviceChoice::Cpu => Ok(cpu(None)),
            DeviceChoice::Auto => Ok(match pagoda_cuda::list_gpus() {
                Ok(gpus) => match gpus.into_iter().next() {
                    Some(g) if g.interpreted => cpu(Some(
                        "the CUDA interpreter is never chosen by auto (it is for checking the \
                         CUDA path, not for speed); ask for --device cuda-interpret"
                            .into(),
                    )),
                    Some(g) => Resolved {
                        device: Device::Cuda(g.ordinal),
                        cpu_because: None,
                        gpu: Some(g),
                    },
                    None => cpu(Some("no NVIDIA GPU found".into())),
                },
                // No driver: a machine without an NVIDIA GPU, where what to install for CUDA
                // is noise (`pagoda devices` and `--device cuda` still say it in full).
                Err(pagoda_cuda::CudaError::MissingLibraries(missing))
                    if missing.contains(&pagoda_cuda::libraries::DRIVER) =>
                {
                    tracing::debug!(
                        "auto device: {}",
                        pagoda_cuda::CudaError::MissingLibraries(missing.clone())
                    );
                    cpu(Some("no NVIDIA driver".into()))
                }
                Err(e) => cpu(Some(e.to_string())),
            }),
            DeviceChoice::CudaInterpret => {
                pagoda_cuda::interpret::install()
                    .map_err(|e| ModelError::Device(format!("--device {self}: {e}")))?;
                DeviceChoice::Cuda(Some(0)).resolve()
            }
            DeviceChoice::Cuda(ordinal) => {
                let gpus = pagoda_cuda::list_gpus()
                    .map_err(|e| ModelError::Device(format!("--device {self}: {e}")))?;
                let want = ordinal.unwrap_or(0);
                let n = gpus.len();
                let gpu = gpus
                    .into_iter()
                    .find(|g| g.ordinal == want)
                    .ok_or_else(|| {
                        ModelError::Device(format!(
                            "--device {self}: this machine has {n} GPU(s) (cuda:0..cuda:{}); \
                         `pagoda devices` lists them",
                            n.saturating_sub(1)
                        ))
                    })?;
                Ok(Resolved {
                    device: Device::Cuda(gpu.ordinal),
                    cpu_because: None,
                    gpu: Some(gpu),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_the_flag_documents_and_names_what_it_refuses() {
        assert_eq!("auto".parse(), Ok(DeviceChoice::Auto));
        assert_eq!("CPU".parse(), Ok(DeviceChoice::Cpu));
        assert_eq!("cuda".parse(), Ok(DeviceChoice::Cuda(None)));
        assert_eq!("cuda:3".parse(), Ok(DeviceChoice::Cuda(Some(3))));
        assert_eq!("cuda-interpret".parse(), Ok(DeviceChoice::CudaInterpret));
        for c in [
            DeviceChoice::Auto,
            DeviceChoice::Cpu,
            DeviceChoice::Cuda(None),
            DeviceChoice::Cuda(Some(1)),
            DeviceChoice::CudaInterpret,
        ] {
            assert_eq!(c.to_string().parse(), Ok(c));
        }
        let e = "cuda:x".parse::<DeviceChoice>().expect_err("not a number");
        assert!(e.contains("cuda:0"), "{e}");
        let e = "tpu".parse::<DeviceChoice>().expect_err("unknown");
        assert!(e.contains("auto, cpu, cuda"), "{e}");
    }

    #[test]
    fn auto_never_fails_and_cuda_names_what_is_missing() {
        let auto = DeviceChoice::Auto.resolve().expect("auto resolves");
        match pagoda_cuda::list_gpus() {
            Ok(gpus) if gpus.first().is_some_and(|g| g.interpreted) => {
                assert_eq!(auto.device, Device::Cpu, "auto never takes the interpreter");
                let why = auto.cpu_because.expect("auto says why");
                assert!(why.contains("--device cuda-interpret"), "{why}");
            }
            Ok(gpus) if !gpus.is_empty() => assert_eq!(auto.device, Device::Cuda(gpus[0].ordinal)),
            Ok(_) => assert_eq!(auto.device, Device::Cpu),
            Err(e) => {
                assert_eq!(auto.device, Device::Cpu);
                // Without a driver, auto says only that (the install hints are for `cuda`).
                let short = matches!(&e, pagoda_cuda::CudaError::MissingLibraries(m)
                    if m.contains(&pagoda_cuda::libraries::DRIVER));
                let want = if short {
                    "no NVIDIA driver".to_string()
                } else {
                    e.to_string()
                };
                assert_eq!(auto.cpu_because, Some(want));
                let err = DeviceChoice::Cuda(None).resolve().expect_err("no GPU");
                assert!(err.to_string().contains(&e.to_string()), "{err}");
            }
        }
        assert_eq!(
            DeviceChoice::Cpu.resolve().expect("cpu").device,
            Device::Cpu
        );
        let err = DeviceChoice::Cuda(Some(999))
            .resolve()
            .expect_err("no such GPU");
        assert!(err.to_string().contains("cuda:999"), "{err}");
    }
}
