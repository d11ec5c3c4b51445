#![no_std]
// This file exists to give the crate a library target, so observer can list
// it as a build-dependency (cargo then rebuilds observer when it changes).
