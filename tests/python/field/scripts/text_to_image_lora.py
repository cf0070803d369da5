"""LoRA fine-tuning of a text-to-image UNet with a frozen VAE and a frozen text encoder, written
the way diffusers' examples/text_to_image/train_text_to_image_lora.py writes it (CLIPTextModel,
AutoencoderKL and UNet2DConditionModel frozen with requires_grad_(False), a PEFT LoraConfig added
to the UNet with add_adapter, AdamW over the LoRA parameters, latents from vae.encode, noise
from DDPMScheduler), on models built from tiny configs, random captions and images, and three
steps."""
import torch
import torch.nn.functional as F
from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
from peft import LoraConfig
from transformers import CLIPTextConfig, CLIPTextModel

from field_truth import write_truth


def main():
    torch.manual_seed(0)
    noise_scheduler = DDPMScheduler(num_train_timesteps=1000)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=16, projection_dim=32,
        bos_token_id=0, eos_token_id=1, pad_token_id=1))
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16),
                        latent_channels=4, norm_num_groups=8, sample_size=16)
    unet = UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(16, 32), norm_num_groups=8, cross_attention_dim=32,
        attention_head_dim=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))

    # freeze parameters of models to save more memory
    unet.requires_grad_(False)
    vae.requires_grad_(False)
    text_encoder.requires_grad_(False)

    unet_lora_config = LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian",
                                  target_modules=["to_k", "to_q", "to_v", "to_out.0"])
    # Add adapter and make sure the trainable params are in float32.
    unet.add_adapter(unet_lora_config)
    lora_layers = filter(lambda p: p.requires_grad, unet.parameters())
    optimizer = torch.optim.AdamW(lora_layers, lr=1e-4, betas=(0.9, 0.999), weight_decay=1e-2,
                                  eps=1e-08)

    unet.train()
    for step in range(3):
        batch = {"pixel_values": torch.randn(2, 3, 16, 16),
                 "input_ids": torch.randint(0, 100, (2, 16))}
        # Convert images to latent space
        latents = vae.encode(batch["pixel_values"]).latent_dist.sample()
        latents = latents * vae.config.scaling_factor

        # Sample noise that we'll add to the latents
        noise = torch.randn_like(latents)
        bsz = latents.shape[0]
        # Sample a random timestep for each image
        timesteps = torch.randint(0, noise_scheduler.config.num_train_timesteps, (bsz,),
                                  device=latents.device).long()

        # Add noise to the latents according to the noise magnitude at each timestep
        noisy_latents = noise_scheduler.add_noise(latents, noise, timesteps)

        # Get the text embedding for conditioning
        encoder_hidden_states = text_encoder(batch["input_ids"], return_dict=False)[0]

        # Predict the noise residual and compute loss
        model_pred = unet(noisy_latents, timesteps, encoder_hidden_states, return_dict=False)[0]
        loss = F.mse_loss(model_pred.float(), noise.float(), reduction="mean")

        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.detach().item()!r}")

    write_truth(unet=unet, vae=vae, text_encoder=text_encoder)


if __name__ == "__main__":
    main()
