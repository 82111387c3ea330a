# Sourced by the build scripts: sets the array `launcher` to CMake arguments that compile
# through ccache (empty without ccache), with paths below the tree $root hashed relative to
# it and the build directory left out of the hash (ccache hashes it by default when
# compiling with -g). So a clone or worktree elsewhere (CI's fresh one) reuses what this
# machine compiled before. They are set in the launcher itself, so a later plain
# `cmake --build` keeps them. (Debug info then names the tree that compiled an object first.)
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER="env;CCACHE_BASEDIR=$root;CCACHE_NOHASHDIR=1;ccache"
            -DCMAKE_C_COMPILER_LAUNCHER="env;CCACHE_BASEDIR=$root;CCACHE_NOHASHDIR=1;ccache")
fi
