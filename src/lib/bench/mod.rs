//! Socket benchmark matrices (issue 5).
