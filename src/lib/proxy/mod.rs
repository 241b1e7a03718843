//! TCP proxy implementations (issue 4).
