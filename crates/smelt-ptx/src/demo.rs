pub fn all() {}
