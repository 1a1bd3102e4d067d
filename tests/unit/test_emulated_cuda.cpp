// The GPU path's memory without a GPU: under TESSERA_EMULATE_CUDA (ctest runs these tests
// again with it set, as unit_emulated_cuda; without it they are skipped) an Allocator on a
// kernels::Device holds Space::cuda buffers, the kernels take them, host access to them is
// refused and transfer copies them to and from host memory.
#include <gtest/gtest.h>

#include <stdexcept>

#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "tensor/device_pool.hpp"

namespace tessera {
namespace {

class EmulatedCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kernels::cuda_emulated() == 0) GTEST_SKIP() << "TESSERA_EMULATE_CUDA is not set";
  }
};

TEST_F(EmulatedCuda, DeviceBuffersAreChargedZeroedAndRefuseHostAccess) {
  kernels::Device device(0);
  Allocator host;
  Allocator alloc(device.pool(), host);
  EXPECT_EQ(alloc.space(), Space::cuda);
  EXPECT_EQ(&alloc.host(), &host);
  Buffer b(alloc, Shape{5, 3}, DType::f32, Charge::grads);
  EXPECT_EQ(b.view().space, Space::cuda);
  EXPECT_EQ(alloc.live(Charge::grads), 60u);
  EXPECT_EQ(device.pool().live(Charge::grads), 60u);
  EXPECT_EQ(host.live_total(), 0u);
  EXPECT_THROW(b.f32(), std::logic_error);
  EXPECT_THROW(b.view().rows(1, 2).f32(), std::logic_error);
  Buffer h(host, Shape{15}, DType::f32, Charge::workspace);
  h.f32()[7] = 1.0f;  // overwritten by the device buffer's zeros
  kernels::transfer(b.view(), h.view(), 15);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(h.f32()[i], 0.0f);
}

TEST_F(EmulatedCuda, KernelsRunOnDeviceTensorsAndTransferRoundTrips) {
  kernels::Device device(0);
  Allocator host;
  Allocator alloc(device.pool(), host);
  Buffer x(alloc, Shape{8}, DType::f32, Charge::activations);
  Buffer y(alloc, Shape{8}, DType::f32, Charge::activations);
  Buffer h(host, Shape{8}, DType::f32, Charge::workspace);
  for (int i = 0; i < 8; ++i) h.f32()[i] = float(i);
  kernels::transfer(h.view(), x.view(), 8);
  kernels::copy(x.view(), y.view(), 8);
  kernels::scale_inplace(y.view(), 2.0f, 8);
  EXPECT_EQ(kernels::sum_squares(y.view(), 8), 4.0 * 140.0);  // 4 (0 + 1 + 4 + ... + 49)
  Buffer back(host, Shape{8}, DType::f32, Charge::workspace);
  kernels::transfer(y.view(), back.view(), 8);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(back.f32()[i], 2.0f * float(i));
  // Mixing spaces in one kernel is an error, as on a GPU.
  EXPECT_THROW(kernels::add_inplace(y.view(), h.view(), 8), Error);
}

TEST_F(EmulatedCuda, AViewThatLostItsSpaceIsCaught) {
  kernels::Device device(0);
  Allocator host;
  Allocator alloc(device.pool(), host);
  Buffer x(alloc, Shape{16}, DType::f32, Charge::params);
  // view_of without a space says host: a GPU would fault on it, emulation raises instead.
  const Tensor lost = view_of(x.view().ptr_f32() + 4, Shape{4});
  EXPECT_THROW(kernels::fill(lost, 1.0f, 4), Error);
  Buffer h(host, Shape{4}, DType::f32, Charge::workspace);
  EXPECT_THROW(kernels::transfer(lost, h.view(), 4), Error);
  kernels::fill(view_of(x.view().ptr_f32() + 4, Shape{4}, Space::cuda), 1.0f, 4);
  EXPECT_EQ(kernels::sum_squares(x.view(), 16), 4.0);
}

TEST_F(EmulatedCuda, DevicesAreCountedAndTheBackendCountsAsBuilt) {
  EXPECT_EQ(kernels::cuda_device_count(), kernels::cuda_emulated());
  EXPECT_TRUE(kernels::cuda_backend_built());
}

}  // namespace
}  // namespace tessera
