//! The two kinds of failure a user can see, and their exit codes: a usage
//! or config mistake (2) and a runtime failure (1). Both print as one line.

/// A failure that ends a run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad flag, size, address or config file: exit code 2.
    #[error("{0}")]
    Usage(String),
    /// Bind refused, host unreachable, socket failure: exit code 1.
    #[error("{0}")]
    Runtime(String),
    /// A system call failed: exit code 1. Prints as `context: source`.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Usage(_) => 2,
            Error::Runtime(_) | Error::Io { .. } => 1,
        }
    }

    pub fn usage(msg: impl Into<String>) -> Self {
        Error::Usage(msg.into())
    }

    pub fn runtime(msg: impl Into<String>) -> Self {
        Error::Runtime(msg.into())
    }

    /// `what: ` in front of the message, keeping the kind and the source.
    pub fn context(self, what: impl std::fmt::Display) -> Error {
        match self {
            Error::Io { context, source } => Error::io(format!("{what}: {context}"), source),
            Error::Usage(m) => Error::Usage(format!("{what}: {m}")),
            Error::Runtime(m) => Error::Runtime(format!("{what}: {m}")),
        }
    }

    /// A failed system call, with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
