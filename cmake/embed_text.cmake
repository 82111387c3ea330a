# Writes OUT, a C++ source defining `extern const char NAME[]` with the bytes of IN (a text
# file), so the library carries the file without reading it at run time. Run by CMake in
# script mode: cmake -DIN=... -DOUT=... -DNAME=... -P embed_text.cmake
file(READ "${IN}" content HEX)
string(LENGTH "${content}" hex_length)
math(EXPR byte_count "${hex_length} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${content}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
file(WRITE "${OUT}" "// Generated from ${IN} by cmake/embed_text.cmake: do not edit.\n#include <cstddef>\nnamespace ckpt {\nextern const char ${NAME}[] = {\n${bytes}0x00};\nextern const size_t ${NAME}Size = ${byte_count};\n}  // namespace ckpt\n")
