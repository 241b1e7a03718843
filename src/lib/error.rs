//! The kinds of failure a user can see, and their exit codes: a usage or
//! config mistake (2), a runtime failure (1), and a run a signal cut short
//! (130 for SIGINT, 143 for SIGTERM). Each prints as one line.

/// A failure that ends a run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad flag, size, address or config file: exit code 2.
    #[error("{0}")]
    Usage(String),
    /// Bind refused, host unreachable, socket failure: exit code 1.
    #[error("{0}")]
    Runtime(String),
    /// A run that SIGINT or SIGTERM stopped before it had a result: the
    /// signal's exit code (130, 143).
    #[error("{message}")]
    Interrupted { message: String, code: i32 },
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
            Error::Interrupted { code, .. } => *code,
        }
    }

    /// A run `signal` stopped, saying `message`.
    pub fn interrupted(message: impl Into<String>, signal: crate::shutdown::Signal) -> Self {
        Error::Interrupted {
            message: message.into(),
            code: signal.exit_code(),
        }
    }

    /// This error, as the end of a run `signal` stopped (when one did):
    /// the message kept, the exit code the signal's. A usage error stays
    /// one: the run never began.
    pub fn after_signal(self, signal: Option<crate::shutdown::Signal>) -> Self {
        match (self, signal) {
            (e @ Error::Usage(_), _) | (e, None) => e,
            (e, Some(signal)) => Error::interrupted(e.to_string(), signal),
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
            Error::Interrupted { message, code } => Error::Interrupted {
                message: format!("{what}: {message}"),
                code,
            },
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
