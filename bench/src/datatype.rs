//! The KServe v2 tensor datatypes, shared with the server through
//! `nereid-proto` (wire names, element sizes, lenient parsing for flags).

pub use nereid_proto::datatype::DataType;
