# Sourced by the device call scripts: what a lent machine lacks for the build, from the carried
# .deb folder (PCRE2's development files, Boost.Program_options 1.74 as static libraries). Sets
# boost_args for cmake.
if ! pkg-config --exists libpcre2-8 2>/dev/null; then
  mkdir -p /tmp/pcre2 && dpkg -x .deb/libpcre2-dev_*.deb /tmp/pcre2
  pc=/tmp/pcre2/usr/lib/x86_64-linux-gnu/pkgconfig
  sed -i "s|^prefix=.*|prefix=/tmp/pcre2/usr|" "$pc/libpcre2-8.pc"
  ln -sf /usr/lib/x86_64-linux-gnu/libpcre2-8.so.0 /tmp/pcre2/usr/lib/x86_64-linux-gnu/libpcre2-8.so
  export PKG_CONFIG_PATH=$pc
fi

# The GPU image has Boost's headers but no program_options library: use Debian's 1.74 (headers,
# static library and CMake config) carried in .deb/, consistently for all of Boost.
boost_args=()
if [ ! -e /usr/lib/x86_64-linux-gnu/libboost_program_options.so ] && ls .deb/libboost1.74-dev_*.deb >/dev/null 2>&1; then
  mkdir -p /tmp/boost174
  for d in .deb/libboost1.74-dev_*.deb .deb/libboost-program-options1.74-dev_*.deb \
    .deb/libboost-program-options1.74.0_*.deb; do dpkg -x "$d" /tmp/boost174; done
  boost_args=(-DBoost_DIR=/tmp/boost174/usr/lib/x86_64-linux-gnu/cmake/Boost-1.74.0 -DBoost_USE_STATIC_LIBS=ON)
fi

# TensorBoard event files need Debian's protobuf (libprotobuf-dev, protobuf-compiler and their
# libprotobuf32/libprotoc32) where the image lacks it: carried in .deb/, added to boost_args.
if ! command -v protoc >/dev/null && ls .deb/protobuf-compiler_*.deb >/dev/null 2>&1; then
  mkdir -p /tmp/protobuf
  for d in .deb/libprotobuf-dev_*.deb .deb/protobuf-compiler_*.deb .deb/libprotobuf32_*.deb .deb/libprotoc32_*.deb; do
    dpkg -x "$d" /tmp/protobuf
  done
  pb=/tmp/protobuf/usr
  export LD_LIBRARY_PATH=$pb/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PATH=$pb/bin:$PATH
  boost_args+=(-DProtobuf_PROTOC_EXECUTABLE=$pb/bin/protoc -DProtobuf_INCLUDE_DIR=$pb/include
    -DProtobuf_LIBRARY=$pb/lib/x86_64-linux-gnu/libprotobuf.so)
fi
