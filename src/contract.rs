#![doc = include_str!("docs/contract.md")]
