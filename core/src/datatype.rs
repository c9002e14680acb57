//! The tensor datatypes, shared with the rest of the workspace through
//! `nereid-proto`.

pub use nereid_proto::datatype::DataType;
