"""Unconditional DDPM training with an EMA of the UNet's weights, written the way diffusers'
examples/unconditional_image_generation/train_unconditional.py writes it (accelerate,
UNet2DModel, DDPMScheduler, EMAModel, AdamW with a cosine schedule), shrunk to a tiny UNet,
random images and three steps."""
import argparse

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from diffusers import DDPMScheduler, UNet2DModel
from diffusers.optimization import get_scheduler
from diffusers.training_utils import EMAModel

from field_truth import write_truth


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--resolution", type=int, default=16)
    parser.add_argument("--train_batch_size", type=int, default=4)
    parser.add_argument("--max_train_steps", type=int, default=3)
    parser.add_argument("--learning_rate", type=float, default=1e-4)
    parser.add_argument("--ema_max_decay", type=float, default=0.9999)
    parser.add_argument("--ema_inv_gamma", type=float, default=1.0)
    parser.add_argument("--ema_power", type=float, default=3 / 4)
    parser.add_argument("--ddpm_num_steps", type=int, default=1000)
    return parser.parse_args()


def main(args):
    accelerator = Accelerator(cpu=True)
    set_seed(0)

    model = UNet2DModel(
        sample_size=args.resolution,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(16, 32),
        norm_num_groups=8,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
    )
    ema_model = EMAModel(
        model.parameters(),
        decay=args.ema_max_decay,
        use_ema_warmup=True,
        inv_gamma=args.ema_inv_gamma,
        power=args.ema_power,
        model_cls=UNet2DModel,
        model_config=model.config,
    )
    noise_scheduler = DDPMScheduler(num_train_timesteps=args.ddpm_num_steps)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, betas=(0.95, 0.999),
                                  weight_decay=1e-6, eps=1e-08)

    images = torch.randn(args.train_batch_size * args.max_train_steps, 3, args.resolution, args.resolution)
    dataset = [{"input": img} for img in images]
    train_dataloader = torch.utils.data.DataLoader(dataset, batch_size=args.train_batch_size)
    lr_scheduler = get_scheduler("cosine", optimizer=optimizer, num_warmup_steps=1,
                                 num_training_steps=args.max_train_steps)
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, lr_scheduler)
    ema_model.to(accelerator.device)

    model.train()
    for step, batch in enumerate(train_dataloader):
        clean_images = batch["input"]
        noise = torch.randn(clean_images.shape, device=clean_images.device)
        bsz = clean_images.shape[0]
        timesteps = torch.randint(0, noise_scheduler.config.num_train_timesteps, (bsz,),
                                  device=clean_images.device).long()
        noisy_images = noise_scheduler.add_noise(clean_images, noise, timesteps)

        with accelerator.accumulate(model):
            model_output = model(noisy_images, timesteps).sample
            loss = F.mse_loss(model_output.float(), noise.float())
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()

        if accelerator.sync_gradients:
            ema_model.step(model.parameters())
        print(f"step {step} loss {loss.detach().item()!r}")

    write_truth(model=accelerator.unwrap_model(model), ema_model=ema_model.shadow_params)


if __name__ == "__main__":
    main(parse_args())
