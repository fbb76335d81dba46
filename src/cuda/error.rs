//! The CUDA layer's error: what a caller needs to tell apart (no usable GPU, device memory
//! exhausted, anything else the driver, NVRTC or a kernel reported). The backend turns it into a
//! DataFusion error in one place (`gpu_error` in src/backend/gpu/mod.rs).

use std::fmt;

use cudarc::driver::DriverError;
use cudarc::driver::sys::CUresult;

#[derive(Debug, Clone, PartialEq)]
pub enum Error {
    /// No usable GPU: the driver or NVRTC library is missing, or no device answers.
    Unavailable(String),
    /// The device (or page-locked host memory) could not hold an allocation of `bytes`.
    OutOfMemory { bytes: usize, detail: String },
    /// Anything else the driver, NVRTC or a kernel reported.
    Device(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// A failed allocation of `bytes`: out of memory when the driver says so.
    pub fn allocation(bytes: usize, e: DriverError) -> Self {
        // The result code's name: DriverError's Display asks the driver, which may be absent.
        let code = format!("{:?}", e.0);
        match e.0 {
            CUresult::CUDA_ERROR_OUT_OF_MEMORY => Error::OutOfMemory { bytes, detail: code },
            _ => Error::Device(format!("GPU allocation of {bytes} bytes failed: {code}")),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Unavailable(reason) => f.write_str(reason),
            Error::OutOfMemory { bytes, detail } => {
                write!(f, "device memory exhausted: an allocation of {} failed ({detail})", format_size(*bytes))
            }
            Error::Device(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for Error {}

impl From<String> for Error {
    fn from(message: String) -> Self {
        Error::Device(message)
    }
}

impl From<&str> for Error {
    fn from(message: &str) -> Self {
        Error::Device(message.to_string())
    }
}

/// `bytes` as the `gpu_memory_limit` option takes it: `512M`, `4G`, or a number of bytes.
pub fn format_size(bytes: usize) -> String {
    match bytes {
        b if b % (1 << 30) == 0 => format!("{}G", b >> 30),
        b if b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use cudarc::driver::DriverError;
    use cudarc::driver::sys::CUresult;

    use super::Error;

    #[test]
    fn out_of_memory_names_the_size() {
        let e = Error::allocation(3 << 30, DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert!(matches!(e, Error::OutOfMemory { bytes, .. } if bytes == 3 << 30));
        assert!(e.to_string().contains("an allocation of 3G failed"), "{e}");
        let other = Error::allocation(64, DriverError(CUresult::CUDA_ERROR_INVALID_VALUE));
        assert!(matches!(other, Error::Device(_)), "{other:?}");
    }
}
