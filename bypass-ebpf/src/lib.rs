//! Host-side placeholder so cargo can track this crate; the programs are in `main.rs`.
#![no_std]
