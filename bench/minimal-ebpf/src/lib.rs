//! Host side of the minimal reference: nothing (the programs are the `bypass-minimal` binary).
#![no_std]
