// Instantiates the codec loops for one instruction-set variant. CMake compiles
// this file once per variant, with its -m flags and RR_KERNEL_VARIANT name.
#include "kernels/codec_impl.h"

namespace rr {
namespace codec {
namespace RR_KERNEL_VARIANT {

CodecFns variant_codec_fns(CodecKind kind) { return codec_fns(kind); }

}  // namespace RR_KERNEL_VARIANT
}  // namespace codec
}  // namespace rr
