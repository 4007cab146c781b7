# Copies one of etcd's .proto files (as Debian's golang-etcd-server-dev installs them) with
# the Go-only options taken out: gogoproto's (code generation of the Go structs) and
# google.api.http's (the JSON gateway). Neither changes a message or a field on the wire, and
# neither is installed where protoc finds it. Usage: cmake -DIN=... -DOUT=... -P strip_proto.cmake
file(READ "${IN}" text)
string(REPLACE "import \"gogoproto/gogo.proto\";" "" text "${text}")
string(REPLACE "import \"google/api/annotations.proto\";" "" text "${text}")
string(REGEX REPLACE "option \\(gogoproto\\.[a-z_]+\\) *= *[a-z]+;" "" text "${text}")
# One level of nested braces: additional_bindings { ... }.
string(REGEX REPLACE "option \\(google\\.api\\.http\\) *= *{([^{}]|{[^{}]*})*};" "" text "${text}")
string(REGEX REPLACE "\\[\\(gogoproto\\.[^]]*\\]" "" text "${text}")
if(text MATCHES "gogoproto|google\\.api")
  message(FATAL_ERROR "${IN}: options left that protoc cannot resolve")
endif()
file(WRITE "${OUT}" "${text}")
