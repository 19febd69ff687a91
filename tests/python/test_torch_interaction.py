#!/usr/bin/python3
"""granary.dlrm.Interaction (granary's C interaction, the trainer's own kernel) against the
same interaction in torch (DenseDLRM(interaction="torch"): batched matmuls and an
index_select), computed in float64 as the reference: the forward output and the gradients of
the bottom output and of every row, for several shapes (dims below and above the kernel's 16
lanes, batches that are not a multiple of 16, one slot); a whole DenseDLRM step either way;
bad buffers raise and name what was wrong."""
import unittest

import grtest

import numpy as np


def reference(bot, embs):
    """[bot, <va, vb> for a > b, a-major] in float64 with autograd."""
    import torch
    b64 = bot.double().detach().requires_grad_(True)
    e64 = embs.double().detach().requires_grad_(True)
    t = torch.cat([b64.unsqueeze(1), e64], dim=1)
    z = torch.bmm(t, t.transpose(1, 2))
    n = t.shape[1]
    li, lj = torch.tril_indices(n, n, offset=-1)
    return b64, e64, torch.cat([b64, z[:, li, lj]], dim=1)


class InteractionTest(unittest.TestCase):
    def test_matches_torch_forward_and_backward(self):
        import torch
        from granary import dlrm
        g = torch.Generator().manual_seed(7)
        for n, ns, d in [(1024, 26, 16), (37, 26, 16), (5, 3, 4), (19, 1, 24), (16, 8, 33)]:
            bot = torch.rand(n, d, generator=g)
            embs = torch.randn(n, ns, d, generator=g) * 0.3
            b = bot.clone().requires_grad_(True)
            e = embs.clone().requires_grad_(True)
            z = dlrm.Interaction.apply(b, e)
            b64, e64, z64 = reference(bot, embs)
            self.assertEqual(tuple(z.shape), (n, d + (ns + 1) * ns // 2))
            np.testing.assert_allclose(z.detach().numpy(), z64.detach().numpy(), rtol=1e-5,
                                       atol=1e-6)
            dz = torch.randn(z.shape, generator=g)
            z.backward(dz)
            z64.backward(dz.double())
            np.testing.assert_allclose(b.grad.numpy(), b64.grad.numpy(), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(e.grad.numpy(), e64.grad.numpy(), rtol=1e-5, atol=1e-5)

    def test_dense_dlrm_either_way(self):
        import torch
        from granary import dlrm
        torch.manual_seed(3)
        dense = torch.rand(300, 13) * 3
        embs = torch.randn(300, 26, 16) * 0.1
        outs = []
        for kind in ("granary", "torch"):
            m = dlrm.DenseDLRM(interaction=kind)
            e = embs.clone().requires_grad_(True)
            y = m(dense, e)
            y.sum().backward()
            outs.append((y.detach(), e.grad, [p.grad for p in m.parameters()]))
        np.testing.assert_allclose(outs[0][0].numpy(), outs[1][0].numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(outs[0][1].numpy(), outs[1][1].numpy(), rtol=1e-4, atol=1e-7)
        for a, b in zip(outs[0][2], outs[1][2]):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6)
        with self.assertRaisesRegex(ValueError, "interaction must be"):
            dlrm.DenseDLRM(interaction="fast")

    def test_bad_buffers_raise(self):
        import granary
        bot = np.zeros((4, 16), np.float32)
        emb = np.zeros((4, 26, 16), np.float32)
        z = np.zeros((4, 16 + 27 * 26 // 2), np.float32)
        granary.dlrm_interact(bot, emb, z, 4, 16, 26)  # the right sizes pass
        with self.assertRaisesRegex(ValueError, "want bot 64, emb 1664 and z 1468 floats"):
            granary.dlrm_interact(bot, emb, z[:3], 4, 16, 26)
        with self.assertRaises((TypeError, ValueError)):
            granary.dlrm_interact(bot.astype(np.float64), emb, z, 4, 16, 26)
        with self.assertRaisesRegex(ValueError, "dbot and gemb"):
            granary.dlrm_interact_backward(z, bot, emb, bot[:2], emb, 4, 16, 26)
        with self.assertRaisesRegex(granary.GranaryError, "dim 0 and 26 slots"):
            granary.dlrm_interact(np.zeros(0, np.float32), np.zeros(0, np.float32),
                                  np.zeros(4 * 351, np.float32), 4, 0, 26)


if __name__ == "__main__":
    grtest.main()
